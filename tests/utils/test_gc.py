import gc

import pytest

from octavo.utils.gc import no_garbage_collection


def test_collection_is_off_inside_and_restored_after():
    assert gc.isenabled()
    with no_garbage_collection():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_restored_after_an_error_and_left_off_if_it_was_off():
    with pytest.raises(RuntimeError), no_garbage_collection():
        raise RuntimeError("capture failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with no_garbage_collection():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
