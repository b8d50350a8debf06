"""Issue 43 (a fresh attacker, seventh round): one broadcast in other bytes.

``wire.broadcast_digest`` hashed each array's bytes and dtype, so the same values sent as float32, as big-endian
``'>f8'`` or with ``-0.0`` for ``0.0`` were a new broadcast: a server asked the moments over all clients, then the
same values as float32 over all but one, and differenced the two sums (the victim's count and sums, 9e-11); under
distributed DP the ``'>f8'`` copy was released again with fresh noise ("never twice" bypassed), and the copy also
escaped the per-broadcast graph pin. The digest now hashes the values (``wire._canonical``).
"""

import numpy as np
import pytest

from gpflow_fed.federated.protection.encoder import EncoderRefusal
from gpflow_fed.federated.protection.wire import broadcast_digest
from gpflow_fed.federated.protocol.messages import Message
from tests.security.test_fourth_attack_round import Parties, _values

THETA = np.array([0.0, 1.5, -2.25])


def _digest(**arrays):
    return broadcast_digest(Message("server", 0, "p", arrays))


@pytest.mark.parametrize(
    "copy",
    [
        pytest.param(THETA.astype(np.float32), id="float32"),
        pytest.param(THETA.astype(">f8"), id="big-endian"),
        pytest.param(np.array([-0.0, 1.5, -2.25]), id="negative zero"),
        pytest.param(np.asfortranarray(THETA[:, None]).reshape(3), id="fortran order"),
    ],
)
def test_the_same_values_in_other_bytes_are_the_same_broadcast(copy):
    assert copy.tobytes() != THETA.tobytes() or copy.dtype != THETA.dtype or copy.flags.f_contiguous
    assert _digest(theta=copy) == _digest(theta=THETA)


def test_other_values_shapes_and_names_are_other_broadcasts():
    digests = {
        _digest(theta=THETA),
        _digest(theta=np.array([0.0, np.nextafter(1.5, 2.0), -2.25])),  # one ulp at 1.5: another value
        _digest(theta=THETA[:, None]),  # another shape
        _digest(eta=THETA),  # another name
        _digest(theta=np.array([0, 1, 2])),  # integers: not the floats 0.0, 1.0, 2.0 (another kind)
        _digest(theta=np.array([np.nan, 1.5, -2.25])),
    }
    assert len(digests) == 6
    nans = np.array([np.nan, 1.5, -2.25])
    other_nan = nans.copy()
    other_nan.view(np.uint64)[0] |= np.uint64(1)  # another NaN payload: the same (missing) value
    assert _digest(theta=nans) == _digest(theta=other_nan)
    assert _digest(theta=np.array([1, 2], dtype=">i4")) == _digest(theta=np.array([1, 2], dtype=np.int64))


@pytest.mark.parametrize("copy", [THETA.astype(np.float32), THETA.astype(">f8")], ids=["float32", "big-endian"])
def test_a_copy_in_other_bytes_is_not_answered_over_another_cohort(copy):
    """The attack: the broadcast's sum over all four parties, then the same values in other bytes over all but p0
    (a new setup, the roster "everyone but p0"): every party that answered the first refuses the second, so the
    difference that gave p0's update cannot be formed."""
    ids = ["p0", "p1", "p2", "p3"]
    parties = Parties(ids)
    values = _values(ids, seed=3)
    np.testing.assert_allclose(parties.secure_sum(ids, values, 0, theta=THETA), sum(values.values()), atol=1e-8)
    with pytest.raises(EncoderRefusal, match="this broadcast of phase 'p'"):  # the same broadcast: refused
        parties.secure_sum(ids[1:], values, 1, theta=copy)
