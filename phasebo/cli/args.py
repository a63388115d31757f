"""Checks of command-line values shared by the commands that write figures and tables: each
refusal is a :class:`~phasebo.settings.ConfigError` naming the flag, the value and the fix, which
the commands print as one line (exit 2) before anything is read or written."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..plot_spec import FIGURE_FORMATS
from ..settings import ConfigError
from ..store import check_out_dir


class Parser(argparse.ArgumentParser):
    """argparse's parser with its errors on one line (``PROG: error: ...``, exit 2), as every
    other refusal of the commands; ``--help`` still prints the usage."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}; fix: see {self.prog} --help\n")


def figure_formats(text: str) -> tuple[str, ...]:
    """``--format png,pdf`` as a tuple; every format must be one of :data:`FIGURE_FORMATS`."""
    formats = tuple(f.strip().lower() for f in text.split(",") if f.strip())
    if not formats or any(f not in FIGURE_FORMATS for f in formats):
        raise ConfigError(f"--format {text!r}: formats are {', '.join(FIGURE_FORMATS)}, e.g. "
                          "--format png,pdf")
    return formats


def at_least(flag: str, value: int | None, low: int = 1) -> None:
    """``--flag`` must be ``>= low`` when given."""
    if value is not None and value < low:
        raise ConfigError(f"--{flag} = {value} must be >= {low}; fix: e.g. --{flag} {low}")


def writable_file(path: str | Path, flag: str) -> Path:
    """A file to write once the work is done: checked now (its directory exists and is
    writable, and it is not a directory), so an hour of work never ends in a traceback."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise ConfigError(f"{flag} {str(path)!r} is a directory; fix: name a file in it, e.g. "
                          f"{flag} {path / 'bench.json'}")
    if not parent.is_dir():
        raise ConfigError(f"{flag} {str(path)!r}: the directory {str(parent)!r} does not exist; "
                          "fix: create it, or name a file in an existing directory")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ConfigError(f"{flag} {str(path)!r} is not writable; fix: choose another file")
    return path


def out_dir(path: str | Path, flag: str = "--out") -> Path:
    """A directory to write into, created now (with its parents): a file, or a place where no
    directory can be made, is refused before anything is computed."""
    path = Path(path)
    try:
        check_out_dir(path)
        path.mkdir(parents=True, exist_ok=True)
    except ConfigError as e:  # name the flag this command calls it by
        raise ConfigError(str(e).replace("--out", flag, 1)) from None
    except OSError as e:
        raise ConfigError(f"{flag} {str(path)!r}: cannot create the directory ({e.strerror}); "
                          "fix: choose a writable directory") from None
    return path
