"""Ctrl-C handling (phasebo.interrupt); the end-to-end stops of real sweeps are in test_execute."""

import signal
import time

import pytest

from phasebo.interrupt import ECHO_S, Abandoned, _interruptible


def test_one_ctrl_c_delivered_twice_at_once_is_one_and_a_later_second_gives_up():
    """GNU ``timeout -s INT`` signals the command and then its process group: the sweep got two
    SIGINTs at once and gave up its blocks in flight, as for a person's second Ctrl-C."""
    with _interruptible() as state:
        state.computing = state.saving = True
        handler = signal.getsignal(signal.SIGINT)
        handler(signal.SIGINT, None)
        handler(signal.SIGINT, None)  # the same one, microseconds later: not a second Ctrl-C
        assert state.stop
        time.sleep(2 * ECHO_S)
        with pytest.raises(Abandoned):  # a person's second Ctrl-C
            handler(signal.SIGINT, None)
