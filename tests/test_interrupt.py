"""Ctrl-C handling (phasebo.interrupt); the end-to-end stops of real sweeps are in test_execute."""

import signal
import time

import pytest

from phasebo.interrupt import ECHO_S, Abandoned, interruptible


def test_one_ctrl_c_delivered_twice_at_once_is_one_and_a_later_second_gives_up():
    """GNU ``timeout -s INT`` signals the command and then its process group: the sweep got two
    SIGINTs at once and gave up its blocks in flight, as for a person's second Ctrl-C."""
    with interruptible() as state:
        state.computing = state.saving = True
        handler = signal.getsignal(signal.SIGINT)
        handler(signal.SIGINT, None)
        handler(signal.SIGINT, None)  # the same one, microseconds later: not a second Ctrl-C
        assert state.stop
        time.sleep(2 * ECHO_S)
        with pytest.raises(Abandoned):  # a person's second Ctrl-C
            handler(signal.SIGINT, None)


def test_the_echo_of_a_ctrl_c_that_left_the_chunk_loop_is_not_a_second_one():
    """A first Ctrl-C outside a chunk's compute raises KeyboardInterrupt out of the loop, which
    hands SIGINT back to the command's latch: timeout's second delivery then raised again inside
    the sweep's clean-up. The latch now knows the first one's time."""
    from phasebo.interrupt import SigintLatch

    latch = SigintLatch()
    with pytest.raises(KeyboardInterrupt):
        latch(signal.SIGINT, None)
    assert latch(signal.SIGINT, None) is None  # its own echo
    time.sleep(2 * ECHO_S)
    before = signal.signal(signal.SIGINT, latch)
    try:
        with pytest.raises(KeyboardInterrupt), interruptible():  # nothing saving: it stops
            signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
        assert signal.getsignal(signal.SIGINT) is latch
        assert latch(signal.SIGINT, None) is None  # the echo, handed to the latch: ignored
        time.sleep(2 * ECHO_S)
        with pytest.raises(KeyboardInterrupt):  # a person's next Ctrl-C
            latch(signal.SIGINT, None)
    finally:
        signal.signal(signal.SIGINT, before)
