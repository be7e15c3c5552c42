"""mmdebstrap's command: the packages asked for, this machine's archive settings, no docs."""

from pathlib import Path

from images import debian_base

DUMP = """APT "";
Acquire::http::Proxy "http://proxy.invalid:3142";
Acquire::Check-Valid-Until "false";
Acquire::Languages "none";
Dir "/";
"""


def test_carried_apt_options_are_the_ones_that_reach_the_archive():
    assert debian_base.carried_apt_options(DUMP) == [
        'Acquire::http::Proxy "http://proxy.invalid:3142"',
        'Acquire::Check-Valid-Until "false"',
    ]


def test_host_mirrors_only_for_the_same_suite():
    sources = [Path("/etc/apt/sources.list.d/debian.sources")]
    assert debian_base.host_mirrors("ID=debian\nVERSION_CODENAME=bookworm\n", sources) == [
        "/etc/apt/sources.list.d/debian.sources"
    ]
    assert debian_base.host_mirrors("ID=ubuntu\nVERSION_CODENAME=noble\n", sources) == []


def test_mmdebstrap_argv():
    argv = debian_base.mmdebstrap_argv(
        ("python3", "gcc"), Path("/x/base.tar"), ['Acquire::Retries "3"'], []
    )
    assert argv[0] == "mmdebstrap"
    assert "--include=gcc,python3" in argv and "--variant=essential" in argv
    assert "--skip=output/dev" in argv
    assert any(a.startswith("--hook-dir=") and a.endswith("merged-usr") for a in argv)
    assert "--dpkgopt=path-exclude=/usr/share/doc/*" in argv
    assert '--aptopt=Acquire::Retries "3"' in argv
    assert argv[-2:] == ["bookworm", "/x/base.tar"]
