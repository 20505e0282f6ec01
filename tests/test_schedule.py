"""Tile orders: every order visits every tile once; the grouped and Hilbert orders keep windows compact."""

import numpy as np
import pytest

from gemmlab import schedule

SHAPES = [(1, 1), (1, 9), (9, 1), (2, 2), (3, 3), (5, 7), (7, 5), (32, 16), (16, 32), (12, 33), (64, 64), (33, 12)]


@pytest.mark.parametrize("name", sorted(schedule.ORDERS))
@pytest.mark.parametrize("tm,tn", SHAPES)
def test_every_tile_exactly_once(name, tm, tn):
    order = schedule.tile_order(name, tm, tn)
    assert len(order) == tm * tn
    assert sorted(order) == schedule.row_major(tm, tn)


@pytest.mark.parametrize("group_m", [1, 3, 8, 100])
def test_grouped_every_tile_once_for_any_group(group_m):
    for tm, tn in SHAPES:
        assert sorted(schedule.grouped(tm, tn, group_m)) == schedule.row_major(tm, tn)


def test_grouped_hand_case():
    # 4 x 3 tiles, groups of 2 rows, each group walked down its columns
    assert schedule.grouped(4, 3, 2) == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2),
                                         (2, 0), (3, 0), (2, 1), (3, 1), (2, 2), (3, 2)]
    # a short last group (5 rows, groups of 2): the last row alone, left to right
    assert schedule.grouped(5, 3, 2)[-3:] == [(4, 0), (4, 1), (4, 2)]


@pytest.mark.parametrize("tm,tn", [(2, 2), (4, 4), (8, 8), (32, 16), (16, 32), (5, 7), (64, 64), (6, 10)])
def test_hilbert_steps_are_neighbours(tm, tn):
    order = schedule.hilbert(tm, tn)
    assert order[0] == (0, 0)
    steps = [abs(a[0] - b[0]) + abs(a[1] - b[1]) for a, b in zip(order, order[1:])]
    assert max(steps) == 1


def test_hilbert_odd_sides_at_most_one_diagonal_step():
    order = schedule.hilbert(12, 33)
    steps = [max(abs(a[0] - b[0]), abs(a[1] - b[1])) for a, b in zip(order, order[1:])]
    assert max(steps) == 1  # never a jump, at worst one diagonal move


def test_windows_touch_fewer_panels_than_row_major():
    # 8192^2 with 128 x 128 tiles: 64 x 64 tiles, 132 in flight
    per = {name: np.mean(schedule.panels_per_window(schedule.tile_order(name, 64, 64), 132))
           for name in ("row_major", "grouped", "hilbert")}
    assert per["row_major"] > 60  # three rows of tiles: every B panel
    assert per["grouped"] < 30 and per["hilbert"] < 30


def test_order_table_packs_m_and_n():
    t = schedule.order_table([(0, 0), (3, 5), (70000 >> 16, 7)])
    assert t.dtype == np.int32
    assert list(t) == [0, (3 << 16) | 5, (1 << 16) | 7]


def test_unknown_order():
    with pytest.raises(ValueError, match="unknown tile order"):
        schedule.tile_order("zigzag", 2, 2)
