"""The collector pause around a trigger and a completion (``checkpointing.collection_paused``):
off inside, back on after (also after an error), left off if it was off.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from airflow_finalckpt.coordination.checkpointing import collection_paused


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


def test_paused_inside_and_back_on_after_even_after_an_error() -> None:
    gc.enable()
    with collection_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collection_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_nested_or_already_off_leaves_it_as_it_was() -> None:
    gc.enable()
    with collection_paused():
        with collection_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner pause does not switch it on early
    assert gc.isenabled()
    gc.disable()
    with collection_paused():
        pass
    assert not gc.isenabled()
