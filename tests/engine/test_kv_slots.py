import pytest

from venusrl.engine.kv_slots import PageAllocator


def test_alloc_and_free_round_trip():
    alloc = PageAllocator(capacity_tokens=10, page_size=4)
    assert alloc.num_pages == 2 and alloc.capacity_tokens == 8
    pages = alloc.alloc(2)
    assert sorted(pages) == [0, 1] and alloc.free_pages == 0
    alloc.check_integrity(pages)
    alloc.free(pages)
    assert alloc.free_pages == 2
    alloc.check_integrity([])


def test_over_allocation_and_bad_frees_are_errors():
    alloc = PageAllocator(capacity_tokens=8, page_size=2)
    with pytest.raises(MemoryError):
        alloc.alloc(5)
    pages = alloc.alloc(1)
    alloc.free(pages)
    with pytest.raises(ValueError, match="double free"):
        alloc.free(pages)
    with pytest.raises(ValueError, match="out of range"):
        alloc.free([4])


def test_integrity_catches_leaks_and_double_holders():
    alloc = PageAllocator(capacity_tokens=8, page_size=2)
    pages = alloc.alloc(2)
    with pytest.raises(AssertionError, match="leaked"):
        alloc.check_integrity(pages[:1])
    with pytest.raises(AssertionError, match="twice"):
        alloc.check_integrity(pages + pages[:1])
    free_page = alloc.alloc(1)
    alloc.free(free_page)
    with pytest.raises(AssertionError, match="both free and held"):
        alloc.check_integrity(pages + free_page)


def test_slot_arithmetic():
    alloc = PageAllocator(capacity_tokens=12, page_size=3)
    assert list(alloc.page_slots(2)) == [6, 7, 8]
    assert alloc.pages_for(0) == 0 and alloc.pages_for(3) == 1 and alloc.pages_for(4) == 2
    # private slots: two whole pages then a partial one
    assert alloc.pages_of([6, 7, 8, 0, 1, 2, 9]) == [2, 0, 3]
