from ledgerstore.cli.main import main

main()
