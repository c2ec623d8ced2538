.PHONY: setup demo test standalone docs
setup:
	bash scripts/setup.sh
demo:
	bash scripts/demo.sh
test:
	bash scripts/test.sh
standalone: setup
	.venv/bin/ledgerstore standalone --bookies 3
