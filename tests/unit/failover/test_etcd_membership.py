"""Membership on etcd, its decisions (training/launch/rendezvous/rounds.py): when the closer opens, closes and
re-forms a round, what an agent does next, where each finds its seat, who gets which place: pure functions of
what the store holds, no etcd (the real members' tests are the integration and e2e tiers' files of this name)."""

from __future__ import annotations

from dataclasses import replace


from training.launch.rendezvous import rounds


# ---------------------------------------------------------------------------------------------- decisions
def closer(r, live, joined, min_nodes=1, max_nodes=2, now=100.0, settled=True):
    return rounds.closer_step(
        r, set(live), list(joined), min_nodes=min_nodes, max_nodes=max_nodes, now=now, last_call_s=3, settled=settled
    )


def test_the_closer_closes_when_everyone_live_is_in_and_reopens_for_a_lost_node():
    S = rounds.Step
    assert closer(None, "ab", "") is S.OPEN  # the job's first round: the closer alone opens it
    first = rounds.Round(n=0)
    assert closer(first, "ab", "") is S.WAIT
    assert closer(first, "ab", "a") is S.MARK_MIN  # the first round waits out the last call below MAX
    assert closer(replace(first, min_at=98.0), "ab", "a") is S.WAIT
    assert closer(replace(first, min_at=96.0), "ab", "a") is S.CLOSE
    assert closer(first, "ab", "ab") is S.CLOSE  # MAX: at once
    reform = rounds.Round(n=3, prev=["a", "b"])
    assert closer(reform, "a", "a") is S.CLOSE  # b is lost: every live member is in, no last call
    assert closer(reform, "ac", "a") is S.MARK_MIN  # c lives but has not joined: the last call
    assert closer(replace(reform, min_at=96.0), "ac", "a") is S.CLOSE  # c is not of the round before: 3 s
    # b lives, trained in the round before and has not joined: it is stopping its workers (or stuck doing so).
    # Closing without it would start a second worker group of the job beside the one still training: however
    # long it takes, only its lease ending lets the round close without it (torch's contract).
    assert closer(replace(reform, min_at=96.0), "abc", "ac") is S.WAIT
    assert closer(replace(reform, min_at=-1e9), "abc", "ac") is S.WAIT
    assert closer(replace(reform, min_at=-1e9), "ac", "ac") is S.CLOSE  # its lease ended: gone
    assert closer(replace(reform, min_at=99.0), "abc", "abc") is S.CLOSE  # it came: at once
    formed = rounds.Round(n=3, formed=True, participants=["b", "a"], prev=["a", "b"])
    assert closer(formed, "abc", "") is S.NOTE_SPARES  # c waits beside it: the record says so (the workers ask)
    assert closer(replace(formed, spares=["c"]), "abc", "") is S.WAIT  # full and healthy, its spare noted
    assert closer(replace(formed, spares=["c"]), "ab", "") is S.NOTE_SPARES  # the spare left
    assert rounds.waiting(formed, {"a", "b", "c", "d"}) == ["c", "d"]
    assert rounds.formed(rounds.Round(n=4), ["a", "b"], {"a", "b", "c"}).spares == ["c"]  # noted as it forms
    gone = rounds.next_round(formed, ["b"], {"b", "x"})  # b left on purpose (its taken-out note): not a loss
    assert gone.lost == ["b"] and gone.taken_out == ["b"] and rounds.next_round(formed, ["b"]).taken_out == []
    assert closer(formed, "ac", "") is S.REOPEN  # b lost
    assert closer(formed, "ac", "", settled=False) is S.WAIT  # right after an outage: b may come back
    assert closer(replace(formed, closed=True), "a", "") is S.WAIT


def test_a_lost_nodes_round_is_formed_at_once_from_the_live_members_and_a_stuck_one_is_left_out_later():
    """A participant lost: the next round is formed in the same step (survivors in their old ranks, a spare in
    the lost rank), with nobody's join; a live participant that has not confirmed its place by the end of the
    window (last call + STOPPING_WORKERS_S, counted from the store answering again after an outage) is stuck."""
    S = rounds.Step
    before = rounds.formed(rounds.Round(n=4), ["a", "b", "c"], {"a", "b", "c", "s"})
    r = rounds.reformed(before, ["s", "c", "a"], lost=["b"], standby={"s"}, min_nodes=2, max_nodes=3, now=50.0)
    assert (r.n, r.formed, r.participants, r.lost, r.presumed_at, r.prev_n) == (
        5,
        True,
        ["a", "s", "c"],
        ["b"],
        50.0,
        4,
    )
    assert rounds.Head.of(r).moved == {"s": 1, "b": -1} and r.spares == []
    # no spare: the survivors close ranks; too few for MIN: None (the closer opens a round instead)
    assert rounds.reformed(before, ["c", "a"], lost=["b"], min_nodes=2, max_nodes=3, now=0).participants == ["a", "c"]
    assert rounds.reformed(before, ["c"], lost=["a", "b"], min_nodes=2, max_nodes=3, now=0) is None
    # a newcomer waiting with room comes in after the survivors; more than MAX: the oldest first, the rest wait
    grown = rounds.reformed(before, ["a", "c", "n1", "n2"], lost=["b"], min_nodes=1, max_nodes=3, now=0)
    assert grown.participants == ["a", "n1", "c"] and grown.spares == ["n2"]
    window = 3 + rounds.STOPPING_WORKERS_S
    assert closer(r, "asc", "", max_nodes=3, now=50.0 + window - 1) is S.WAIT  # still in the window
    assert closer(r, "asc", "as", max_nodes=3, now=50.0 + window - 1) is S.WAIT
    assert closer(r, "asc", "asc", max_nodes=3, now=50.0 + window + 1) is S.WAIT  # everyone came
    assert closer(r, "asc", "as", max_nodes=3, now=50.0 + window + 1) is S.REOPEN  # c lives, but never came
    assert rounds.unconfirmed(r, {"a", "s", "c"}, ["a", "s"], now=50.0 + window + 1, last_call_s=3) == ["c"]
    # the store was away until 60: the leases and the confirmations expired with it; the window starts again
    assert rounds.unconfirmed(r, {"a", "s", "c"}, [], now=50.0 + window + 1, last_call_s=3, answering_since=60.0) == []
    assert rounds.unconfirmed(before, {"a", "b", "c"}, [], now=1e9, last_call_s=3) == []  # formed from joins
    again = rounds.reformed(r, ["c", "a", "s"], lost=[], stuck=["c"], min_nodes=1, max_nodes=3, now=90.0)
    assert (again.participants, again.lost, again.stuck, again.spares) == (["a", "s"], ["c"], ["c"], [])
    head = rounds.Head.loads(rounds.Head.of(again).dumps())
    assert head.stuck == ["c"] and head.as_round().stuck == ["c"]


def test_the_head_every_agent_watches_stays_small_at_any_job_size():
    ids = [f"ip-10-0-{i // 256}-{i % 256}-4242-abcdef" for i in range(1024)]
    before = rounds.Round(n=0, formed=True, participants=ids)
    r = rounds.formed(rounds.next_round(before, [ids[0]]), ids[1:], set(ids[1:]) | {"spare"})
    head = rounds.Head.of(r)
    assert len(r.dumps()) > 50_000 and len(head.dumps()) < 300  # what each of 1,024 agents receives per change
    back = rounds.Head.loads(head.dumps())
    assert back == head and (back.n, back.formed, back.spares, back.lost) == (1, True, 1, [ids[0]])
    assert back.as_round().participants == [] and rounds.Head.of(back.as_round()).spares == 0


def test_what_an_agent_does_next():
    S = rounds.Step
    step = rounds.agent_step
    assert step("a", -1, None, False, max_nodes=2) is S.WAIT  # the closer opens the first round
    open_round = rounds.Round(n=3, prev=["a", "b"])
    assert step("a", 2, open_round, False, max_nodes=2) is S.JOIN
    assert step("a", 2, open_round, True, max_nodes=2) is S.WAIT
    formed = rounds.Round(n=3, formed=True, participants=["b", "a"])
    assert step("c", -1, formed, False, max_nodes=2) is S.STAND_BY  # full: c is a spare
    assert step("a", 3, formed, False, max_nodes=2) is S.NEW_ROUND  # a's workers failed: everyone re-forms
    assert step("a", 2, formed, False, max_nodes=2) is S.DONE
    assert step("c", -1, replace(formed, participants=["a"]), False, max_nodes=2) is S.NEW_ROUND  # room
    # what the agents see of a formed round: the head (no member lists) and their own page of its seats
    head = rounds.Head.of(formed).as_round()
    page = lambda member: rounds.seat_pages(formed)[rounds.page_of(member, 1)]  # noqa: E731
    assert step("a", 2, head, False, max_nodes=2, seats=page("a")) is S.DONE
    assert step("c", -1, head, False, max_nodes=2, seats=page("c")) is S.STAND_BY
    assert step("c", -1, head, False, max_nodes=3, seats=page("c")) is S.NEW_ROUND


def test_each_agent_finds_its_seat_on_a_small_page_of_the_formed_round():
    ids = [f"ip-10-0-{i // 256}-{i % 256}-4242-{i:06x}" for i in range(1024)]
    r = rounds.formed(rounds.Round(n=7), list(reversed(ids)), set(ids))
    pages = rounds.seat_pages(r)
    assert len(pages) == rounds.page_count(1024) == 16
    for member in ids:  # on the page its id names, at its rank in the record
        page = pages[rounds.page_of(member, len(pages))]
        assert (page.n, page.size, page.ranks[member]) == (7, 1024, r.participants.index(member))
    assert sum(len(p.ranks) for p in pages.values()) == 1024
    assert max(len(p.dumps()) for p in pages.values()) < 4_000 and len(r.dumps()) > 25_000
    assert rounds.Seats.loads(pages[3].dumps()) == pages[3]
    assert rounds.page_count(1) == 1 and rounds.page_count(64) == 1 and rounds.page_count(65) == 2
    assert rounds.Head.of(r).size == 1024


def _page_seat(formed: rounds.Round, member: str) -> dict[str, int]:
    """``member``'s seat as its page of ``formed`` gives it (``{}``: none), what an agent read before."""
    pages = rounds.seat_pages(formed)
    page = pages[rounds.page_of(member, len(pages))]
    return {member: page.ranks[member]} if member in page.ranks else {}


def test_a_node_of_the_round_before_finds_its_seat_in_the_head_as_its_page_gives_it():
    """A re-formation after a lost node changes one or two seats: the head names them, and each node of the
    round before finds its own seat there (the same as its page says) instead of 1,023 page reads at once."""
    import random

    ids = [f"ip-10-0-{i // 256}-{i % 256}-4242-{i:06x}" for i in range(1024)]
    before = rounds.formed(rounds.Round(n=5), ids, set(ids) | {"spare"})
    survivors = ids[1:]  # rank 0 lost; a spare waits
    nxt = rounds.next_round(before, [ids[0]])
    assert nxt.prev_n == 5 and rounds.next_round(nxt).prev_n == 5  # a round that did not form passes it on
    live = set(survivors) | {"spare"}
    r = rounds.formed(nxt, rounds.choose(nxt, ["spare", *survivors], live, set(), 1024), live)
    head = rounds.Head.loads(rounds.Head.of(r).dumps())
    assert head.moved == {"spare": 0, ids[0]: -1} and len(head.dumps()) < 400
    for rank, member in enumerate(ids):
        seat = rounds.seat_from_head(head, member, (5, member, rank))
        assert seat.ranks == _page_seat(r, member) and (seat.n, seat.size) == (6, 1024)
    assert rounds.seat_from_head(head, ids[3], (4, ids[3], 3)) is None  # its place was in another round
    assert rounds.seat_from_head(head, "renewed", (5, ids[3], 3)) is None  # joined again under a new id
    assert rounds.seat_from_head(rounds.Head.of(before), ids[3], None) is None  # the first round: its page
    # without a spare the last rank moves to the lost one's: two changes
    r = rounds.formed(nxt, rounds.choose(nxt, survivors, set(survivors), set(), 1024), set(survivors))
    assert rounds.Head.of(r).moved == {ids[-1]: 0, ids[0]: -1}
    # any round that follows a formed one, small and random: the head's seat is the page's, or the page is read
    rng = random.Random(7)
    for _ in range(3000):
        n = rng.randint(1, 24)
        members = [f"m{i}" for i in range(n + 6)]
        prev = rounds.formed(rounds.Round(n=2), rng.sample(members, n))
        live = set(rng.sample(members, rng.randint(1, len(members))))
        joined = rng.sample(sorted(live), rng.randint(0, len(live)))
        standby = set(rng.sample(members, rng.randint(0, 3)))
        nxt = rounds.next_round(prev, [p for p in prev.participants if p not in live])
        chosen = rounds.choose(nxt, joined, live, standby, rng.randint(1, n + 4))
        if not chosen:
            continue
        r = rounds.formed(nxt, chosen, live)
        head = rounds.Head.of(r)
        changes = sum(prev.participants.index(p) != chosen.index(p) for p in set(chosen) & set(prev.participants))
        assert (head.moved is None) == (
            changes + len(set(chosen) - set(prev.participants)) + len(set(prev.participants) - set(chosen))
            > rounds.HEAD_MOVES_MAX
        )
        for rank, member in enumerate(prev.participants):
            seat = rounds.seat_from_head(head, member, (2, member, rank))
            assert seat is None if head.moved is None else seat.ranks == _page_seat(r, member)


def test_places_keep_old_ranks_spares_fill_gaps_and_standby_members_come_last():
    r = rounds.Round(n=4, prev=["a", "b", "c"])
    assert rounds.choose(r, ["s", "b", "c"], {"s", "b", "c"}, set(), 3) == ["s", "b", "c"]  # s takes a's rank 0
    r = rounds.Round(n=4, prev=["a", "b"])
    assert rounds.choose(r, ["s", "a", "b"], {"s", "a", "b"}, set(), 2) == ["a", "b"]  # survivors first
    first = rounds.Round(n=0)
    assert rounds.choose(first, ["h", "x", "y"], {"h", "x", "y"}, {"h"}, 2) == ["x", "y"]  # h asked to stand by
    # the first round follows the nodes' own numbering (T5_NODE_RANK), not who joined first; spares stay last
    index = {"n1": 1, "n0": 0, "n2": 2}
    assert rounds.choose(first, ["n1", "n2", "n0"], {"n0", "n1", "n2"}, set(), 2, index) == ["n0", "n1"]
    assert rounds.choose(first, ["n1", "n0", "n2"], {"n0", "n1", "n2"}, {"n0"}, 2, index) == ["n1", "n2"]
    assert rounds.choose(first, ["u", "n1"], {"u", "n1"}, set(), 2, index) == ["n1", "u"]  # no index: after
    r = rounds.Round(n=4, prev=["n1", "n0"])
    assert rounds.choose(r, ["n0", "n2", "n1"], {"n0", "n1", "n2"}, set(), 2, index) == ["n1", "n0"]  # ranks kept
