"""Checks of command-line values shared by the commands that write figures and tables: each
refusal is a :class:`~phasebo.settings.ConfigError` naming the flag, the value and the fix, which
the commands print as one line (exit 2) before anything is read or written."""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .. import config as C
from ..plot_spec import FIGURE_FORMATS
from ..registry import all_settings
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


def parse_set(items: Iterable[str]) -> dict[str, Any]:
    """``--set key=value`` strings -> dict; a value in TOML syntax may be a list or a range."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set d=1000")
        key, text = (x.strip() for x in item.split("=", 1))
        if not key:
            raise ConfigError(f"--set {item!r}: the key is empty; expected key=value")
        C._setting(key, "--set ")
        try:
            value = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError as e:
            if text and text[0] in "[{":  # meant as a list or a range: say what does not parse
                words = [w.strip().strip("'\"") for w in text.strip("[]{} ").split(",")]
                fix = (f"'{key}=[" + ", ".join(f'"{w}"' for w in words if w) + "]' (words in "
                       "quotes)" if all_settings()[key].type in (str, tuple) else
                       f"'{key}=[10, 40]' or '{key}={{start=5, stop=100, step=5}}'")
                raise ConfigError(f"--set {key}: {text!r} is not a valid TOML list or range "
                                  f"({str(e).split(' (at')[0]}); fix: e.g. --set {fix}") from None
            value = text  # a bare word such as --set model=prompt_attention, or a number
            if all_settings()[key].type in (int, float):  # TOML does not read, such as .005
                value = _number(text)
        if key in out and out[key] != value:  # which one was meant is not ours to guess
            raise ConfigError(f"--set {key} is given twice ({out[key]!r} and {value!r}); fix: "
                              f"give it once (a list sweeps both: --set '{key}=[...]')")
        out[key] = value
    return out


def _number(text: str):
    try:
        return float(text)
    except ValueError:
        return text  # refused, as not a number, with its setting's fix
