"""The container test's tests run last (image_prebuild.order_last), so the image's background
build overlaps the rest of the run: those of tests/deploy/test_container.py that use the `image`
fixture move to the end in their order; everything else keeps its order, another module's
fixture of the same name included. Hand-made items: the rule reads a test's module name and
fixture names only. A machine without Docker starts no background build and the collection goes
on (the container tests then fail on their own, saying why)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.deploy import image_prebuild


def _item(module: str, *fixtures: str) -> SimpleNamespace:
    return SimpleNamespace(module=SimpleNamespace(__name__=module), fixturenames=list(fixtures))


def test_the_tests_that_need_the_image_move_last_in_their_order():
    serves = _item("tests.deploy.test_container", "container", "image")
    lint = _item("tests.deploy.test_container")
    other = _item("tests.engine.test_images", "image")  # not the container test's fixture
    small = _item("tests.deploy.test_container", "image")
    items = [serves, lint, other, small]
    image_prebuild.order_last(items)  # type: ignore[arg-type]
    assert [id(i) for i in items] == [id(lint), id(other), id(serves), id(small)]

    unchanged = [lint, other]
    image_prebuild.order_last(unchanged)  # type: ignore[arg-type]
    assert [id(i) for i in unchanged] == [id(lint), id(other)]


def test_without_docker_no_build_starts_and_the_collection_goes_on(monkeypatch, tmp_path):
    def no_docker() -> None:
        pytest.fail("dockerd did not start")

    monkeypatch.setattr(image_prebuild, "_build", {})  # this run's own build, if any, untouched
    monkeypatch.setattr(image_prebuild, "_idle_cgroup", lambda: tmp_path)
    monkeypatch.setattr(image_prebuild.docker_host, "ensure_docker", no_docker)
    monkeypatch.delenv("TGSERVE_TEST_PREBUILD", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    config = SimpleNamespace(option=SimpleNamespace(collectonly=False))
    items = [_item("tests.deploy.test_container", "image")]
    assert image_prebuild.start(items, config) is False  # type: ignore[arg-type]
    assert not image_prebuild.started()
