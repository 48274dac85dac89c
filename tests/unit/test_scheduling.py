"""Who builds what: the assignment of a build's tasks to ranks."""

from megacache.builders.scheduling import largest_first, largest_first_groups


def test_a_groups_jobs_go_to_one_rank_and_the_groups_are_balanced():
    # three splits of each of six datasets: train large, valid and test small
    costs, keys = [], []
    for d, size in enumerate([90, 70, 50, 40, 30, 20]):
        for share in (90, 8, 2):
            costs.append(size * share)
            keys.append(f"dataset-{d}")
    owners = largest_first_groups(costs, keys, 2)
    for d in range(6):
        assert len({owners[3 * d + s] for s in range(3)}) == 1, d
    loads = [sum(c for c, o in zip(costs, owners) if o == r) for r in range(2)]
    # the datasets' totals 90 70 50 40 30 20 by largest first: 90+40+20 against 70+50+30
    assert loads == [15000, 15000]


def test_jobs_alone_in_their_groups_are_placed_as_largest_first_places_them():
    costs = [5, 9, 1, 7, 3, 8]
    assert largest_first_groups(costs, range(6), 3) == largest_first(costs, 3)
