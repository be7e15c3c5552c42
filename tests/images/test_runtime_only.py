"""No image carries what installs, builds or tests code: the check a built image's
/opt/infergrid passes before it is tagged."""

import pytest

from images import runtime_only


def test_forbidden_is_the_build_tools_and_the_test_extra(pyproject):
    banned = runtime_only.forbidden(pyproject)
    assert {"pip", "setuptools", "wheel", "grpcio-tools"} <= banned
    assert {"pytest", "pytest-timeout", "hypothesis", "ruff"} <= banned


def test_no_runtime_dependency_is_forbidden(pyproject):
    banned = runtime_only.forbidden(pyproject)
    project = pyproject["project"]
    runtime = [*project["dependencies"], *project["optional-dependencies"]["engine"]]
    assert runtime_only.present([r.partition("==")[0] for r in runtime], banned) == []


def test_refuse_names_every_forbidden_package_found():
    banned = frozenset({"pip", "setuptools", "grpcio-tools", "pytest"})
    runtime_only.refuse(["kopf", "grpcio", "numpy"], banned, "the operator image")
    with pytest.raises(ValueError, match="the engine image holds .*: grpcio-tools, setuptools"):
        runtime_only.refuse(["torch", "setuptools", "grpcio_tools"], banned, "the engine image")


def test_installed_reads_the_distribution_names_of_a_site_packages(tmp_path):
    for folder in ("grpcio_tools-1.85.1.dist-info", "kopf-1.45.2.dist-info", "kopf", "x.pth"):
        (tmp_path / folder).mkdir()
    assert runtime_only.installed(tmp_path) == ["grpcio_tools", "kopf"]
    assert runtime_only.installed(tmp_path / "absent") == []
