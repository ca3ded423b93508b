"""The per-object memo (:mod:`autoplan._memo`): its accessors compute once per owner (and
arguments)."""

from __future__ import annotations

from autoplan._memo import forget, memo, per_owner, per_owner_and_args


class _Owner:
    pass


class _Slotted:
    __slots__ = ()


def test_per_owner_and_args_computes_once_per_owner_and_args():
    calls = []

    @per_owner_and_args
    def scaled(owner, k, m=1):
        """The owner's scale."""
        calls.append((owner, k, m))
        return [k * m]

    a, b = _Owner(), _Owner()
    first = scaled(a, 2)
    assert scaled(a, 2) is first and calls == [(a, 2, 1)]  # the same owner and args: once
    assert scaled(a, 3) == [3] and scaled(a, 2, 5) == [10]  # other args: computed apart
    assert scaled(b, 2) is not first and scaled(b, 2) == [2]  # another owner: its own value
    assert calls == [(a, 2, 1), (a, 3, 1), (a, 2, 5), (b, 2, 1)]
    assert scaled.__name__ == "scaled" and scaled.__doc__ == "The owner's scale."
    forget(a)
    assert scaled(a, 2) is not first and len(calls) == 5  # forgotten: computed again


def test_owners_without_a_dict_are_not_cached():
    calls = []

    @per_owner_and_args
    def with_args(owner, k):
        calls.append(k)
        return k

    @per_owner
    def alone(owner):
        calls.append(None)
        return 0

    for owner in (_Slotted(), 7):
        calls.clear()
        assert with_args(owner, 1) == with_args(owner, 1) == 1 and alone(owner) == alone(owner) == 0
        assert calls == [1, 1, None, None]


def test_accessors_own_their_values():
    """Two accessors never read each other's values, whatever their arguments, and a direct
    ``memo`` call with an accessor's key is that accessor's value."""

    @per_owner
    def alone(owner):
        return "alone"

    @per_owner_and_args
    def with_args(owner, *args):
        return ("with", *args)

    owner = _Owner()
    assert alone(owner) == "alone" and with_args(owner) == ("with",)
    assert with_args(owner, alone) == ("with", alone)
    assert memo(owner, alone, lambda: "other") == "alone"
    assert memo(owner, (with_args, 1), lambda: "direct") == "direct" == memo(
        owner, (with_args, 1), lambda: "again")
    assert with_args(owner, 1) == "direct"  # the same key: the one value
