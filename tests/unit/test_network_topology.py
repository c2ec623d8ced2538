"""Racks from where bookies really are: the placement policies' topology file, and bookies that
must advertise an address clients can reach."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledgerstore.api import BookieInfo
from ledgerstore.config_schema import BookieConfig
from ledgerstore.errors import ConfigError
from ledgerstore_placement import RackAwarePlacement, RegionAwarePlacement
from ledgerstore_placement.topology import NetworkTopology, host_of


def _mapping(tmp_path: Path, text: str) -> str:
    path = tmp_path / "topology.txt"
    path.write_text(text)
    return str(path)


def test_host_of_strips_scheme_port_and_brackets() -> None:
    assert host_of("tcp+tls://bookie1.example:3181") == "bookie1.example"
    assert host_of("10.0.0.1:3181") == "10.0.0.1"
    assert host_of("[fd00::1]:3181") == "fd00::1"


def test_locations_come_from_the_file_by_id_host_endpoint_or_address(tmp_path: Path) -> None:
    topo = NetworkTopology(_mapping(tmp_path, (
        "# host  location\n"
        "b1.example:3181 /dc1/r1\n"
        "b2.example      /dc1/r2   # by host\n"
        "127.0.0.1       /dc2/r1\n"
    )))
    by_id = BookieInfo("b1.example:3181", rack="/lies")
    by_host = BookieInfo("b2.example:3182")
    by_endpoint = BookieInfo("some-id:1", endpoint="tcp://b2.example:3181")
    by_address = BookieInfo("localhost:3181")  # resolves to 127.0.0.1 here
    unknown = BookieInfo("nowhere.invalid:3181", region="r")
    located = topo.locate([by_id, by_host, by_endpoint, by_address, unknown])
    assert [(b.rack, b.region) for b in located] == [
        ("/dc1/r1", "dc1"), ("/dc1/r2", "dc1"), ("/dc1/r2", "dc1"), ("/dc2/r1", "dc2"), ("/default-rack", "r"),
    ]


def test_a_malformed_line_is_a_config_error_naming_the_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"line 2: expected 'HOST /LOCATION'"):
        NetworkTopology(_mapping(tmp_path, "a /r1\nb rack-without-slash\n"))


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        RackAwarePlacement(topology_file=str(tmp_path / "absent"))


def test_rack_aware_placement_reads_racks_from_the_file_not_the_registration(tmp_path: Path) -> None:
    # every bookie registers the default rack; the file puts them on two racks
    path = _mapping(tmp_path, "".join(f"h{i} /rack-{i % 2}\n" for i in range(4)))
    bookies = [BookieInfo(f"h{i}:3181") for i in range(4)]
    policy = RackAwarePlacement(topology_file=path, seed=1)
    racks = {f"h{i}": f"/rack-{i % 2}" for i in range(4)}
    for _ in range(20):
        ensemble = policy.new_ensemble(2, 2, 2, bookies)
        assert {racks[b.split(":")[0]] for b in ensemble} == {"/rack-0", "/rack-1"}
        assert policy.is_ensemble_adhering(ensemble, 2, 2, bookies)
    assert not policy.is_ensemble_adhering(["h0:3181", "h2:3181"], 2, 2, bookies)
    # without the file the registrations say one rack: the constraint cannot be met
    with pytest.raises(Exception, match="only 1 rack"):
        RackAwarePlacement(seed=1).new_ensemble(2, 2, 2, bookies)


def test_region_aware_placement_takes_the_region_from_the_first_level(tmp_path: Path) -> None:
    path = _mapping(tmp_path, "h0 /east/r1\nh1 /east/r2\nh2 /west/r1\nh3 /west/r2\n")
    bookies = [BookieInfo(f"h{i}:3181") for i in range(4)]
    ensemble = RegionAwarePlacement(topology_file=path, seed=3).new_ensemble(2, 2, 2, bookies)
    assert {b[1] in "01" for b in ensemble} == {True, False}


@pytest.mark.parametrize("listen, advertised", [
    ("tcp://0.0.0.0:3181", ""),
    ("tcp://[::]:3181", ""),
    ("tcp://10.0.0.1:3181", "tcp://0.0.0.0:3181"),
])
def test_a_bookie_never_advertises_every_interface(listen: str, advertised: str) -> None:
    problems = BookieConfig(metadata="sqlite:///m.db", listen=listen, advertised_address=advertised).validate()
    assert any("names every interface" in p for p in problems), problems


def test_a_bookie_listens_on_every_interface_and_advertises_its_name() -> None:
    cfg = BookieConfig(metadata="sqlite:///m.db", listen="tcp://0.0.0.0:3181",
                       advertised_address="tcp://bookie1.example:3181")
    assert cfg.validate() == []
