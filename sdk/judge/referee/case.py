"""Rule case files: one pair, its roster and history, replayed through the same code.

A case file is plain JSON, so corpora of rule cases can be replayed::

    {"now": RFC 3339 UTC,
     "settings": {"adjudicate_differing_twins": bool | null, "referee_bar_days": int | null},
     "pair": {"twin_bracket_id": str | null, "request_digest": hex,
              "request": the twins' request body (optional: when disclosed),
              "halves": [{"node_id", "text", "capsule_id", "record",
                          "model_hash", "weights_digest", "temperature", "body" (optional)}, …]},
     "roster": [{"node_id", "model_hash", "weights_digest", "announced_key": PEM | null, "blocked": bool}],
     "history": [{"node_id", "model_hash", "bucket": "corroborated" | "contradicted", "recorded_at"}],
     "referee": {"<node id>": {"reanswer": text | null, "signs": bool, "key": signer URI}},
     "draws": [int, …]}

A half's ``record`` is its sealed capseal record; ``model_hash``,
``weights_digest`` and ``temperature`` are the host's view (the request path),
each taken from the record when the member is absent. ``reanswer`` null is a
referee that does not answer; ``signs`` false one that answers but cannot sign.
A ``file:`` key path is read relative to the case file. ``draws`` are the picks
an injected random source returns (tests); without them the pick is the CSPRNG's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capseal.errors import CaseFileError, InputError, MalformedJSONError, RefereeInputError, SignerError
from capseal.record import strict_json

from .bar import Recorded, parse_time
from .book import Book
from .facade import Referee, RuleAnswer
from .gates import Settings
from .halves import Half, HostView, load_half, record_parts, serving_facts
from .pairs import Pair, make_pair
from .ruling import RefereeSeat
from .selection import Candidate, ScriptedDraw
from .transports import ReplayTransport

__all__ = ["Case", "load_case", "read_case", "run_case", "open_seats"]

_TOP = {"now", "settings", "pair", "roster", "history", "referee", "draws"}
_HALF = {"node_id", "text", "capsule_id", "record", "model_hash", "weights_digest", "temperature", "body"}


def _case_error(exc: RefereeInputError) -> CaseFileError:
    return CaseFileError(str(exc).rsplit(" (at ", 1)[0], path=exc.path)


@dataclass(frozen=True)
class Case:
    """A read case file (nothing checked against keys yet)."""

    now: str
    settings: Settings
    pair: dict[str, Any]
    roster: tuple[Candidate, ...]
    history: tuple[Recorded, ...]
    referee: dict[str, dict[str, Any]]
    draws: tuple[int, ...] | None
    base: Path

    def halves(self) -> Pair:
        """The case's pair, each half checked (V1) against its server's announced key.

        Returns:
            The :class:`Pair`.

        Raises:
            PairRefusedError: a refused pair (one half, different requests, a forged half …).
        """
        keys = {c.node_id: c.announced_key for c in self.roster}
        request = self.pair.get("request")
        halves: list[Half] = []
        for i, h in enumerate(self.pair["halves"]):
            path = f"$.pair.halves[{i}]"
            capsule, _ = record_parts(h["record"], f"{path}.record")
            if "capsule_id" in h and h["capsule_id"] != capsule.get("capsule_id"):
                from capseal.errors import PairRefusedError

                raise PairRefusedError("capsule_id is not the id its record carries", rule="V1", reason="half_forged",
                                       path=f"{path}.capsule_id")
            facts = serving_facts(capsule)
            host = HostView(h["node_id"], h.get("model_hash", facts.get("model_hash")),
                            h.get("weights_digest", facts.get("weights_digest")),
                            h.get("temperature", facts.get("temperature")))
            halves.append(load_half(h["record"], node_id=h["node_id"], announced=keys.get(h["node_id"]),
                                    text=h["text"], body=h.get("body"), request=request, host=host, path=path))
        return make_pair(self.pair.get("twin_bracket_id"), self.pair.get("request_digest"), halves, request=request)


def _member(obj: Mapping[str, Any], name: str, kinds: tuple[type, ...], path: str, *, required: bool = True) -> Any:
    if name not in obj:
        if required:
            raise CaseFileError(f"{name} is missing", path=f"{path}.{name}")
        return None
    value = obj[name]
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise CaseFileError(f"{name} is {' or '.join(k.__name__ for k in kinds)}, not {type(value).__name__}",
                            path=f"{path}.{name}")
    return value


def read_case(value: Any, base: Path = Path(".")) -> Case:
    """A case from its parsed JSON.

    Args:
        value: the parsed case file.
        base: the directory ``file:`` key paths are read relative to.

    Returns:
        The :class:`Case`.

    Raises:
        CaseFileError: a member missing, unknown or of the wrong type; an unknown
            setting; a non-integer bar; a bad time, roster entry or history entry.
    """
    try:
        return _read(value, base)
    except CaseFileError:
        raise
    except RefereeInputError as exc:
        raise _case_error(exc) from None


def _read(value: Any, base: Path) -> Case:
    if not isinstance(value, Mapping):
        raise CaseFileError(f"a case file holds a JSON object, not {type(value).__name__}")
    extra = sorted(set(map(str, value)) - _TOP)
    if extra:
        raise CaseFileError(f"unknown member {extra[0]!r} (a case file holds {', '.join(sorted(_TOP))})", path=f"$.{extra[0]}")
    now = _member(value, "now", (str,), "$")
    parse_time(now, "$.now")
    settings = Settings.from_json(value.get("settings"))
    pair = _member(value, "pair", (dict,), "$")
    extra = sorted(set(pair) - {"twin_bracket_id", "request_digest", "request", "halves"})
    if extra:
        raise CaseFileError(f"unknown member {extra[0]!r} in pair", path=f"$.pair.{extra[0]}")
    _member(pair, "request_digest", (str,), "$.pair")
    halves = _member(pair, "halves", (list,), "$.pair")
    for i, h in enumerate(halves):
        path = f"$.pair.halves[{i}]"
        if not isinstance(h, Mapping):
            raise CaseFileError(f"a half is an object, not {type(h).__name__}", path=path)
        extra = sorted(set(map(str, h)) - _HALF)
        if extra:
            raise CaseFileError(f"unknown member {extra[0]!r} in a half", path=f"{path}.{extra[0]}")
        _member(h, "node_id", (str,), path)
        _member(h, "text", (str,), path)
        _member(h, "record", (dict,), path)
        _member(h, "capsule_id", (str,), path, required=False)
    roster = _member(value, "roster", (list,), "$", required=False) or []
    candidates = tuple(Candidate.from_json(c, f"$.roster[{i}]") for i, c in enumerate(roster))
    history_raw = _member(value, "history", (list,), "$", required=False) or []
    history = tuple(Recorded.from_json(r, f"$.history[{i}]") for i, r in enumerate(history_raw))
    referees = _member(value, "referee", (dict,), "$", required=False) or {}
    for node, spec in referees.items():
        path = f"$.referee.{node}"
        if not isinstance(spec, Mapping):
            raise CaseFileError("a referee entry is an object {reanswer, signs, key}", path=path)
        extra = sorted(set(map(str, spec)) - {"reanswer", "signs", "key"})
        if extra:
            raise CaseFileError(f"unknown member {extra[0]!r} in a referee entry", path=f"{path}.{extra[0]}")
        if spec.get("reanswer") is not None and not isinstance(spec.get("reanswer"), str):
            raise CaseFileError("reanswer is the re-answer text, or null for no answer", path=f"{path}.reanswer")
        if not isinstance(spec.get("signs", False), bool):
            raise CaseFileError("signs is true or false", path=f"{path}.signs")
        if spec.get("signs") and not isinstance(spec.get("key"), str):
            raise CaseFileError("a referee that signs names its signer's key URI", path=f"{path}.key")
    draws = _member(value, "draws", (list,), "$", required=False)
    if draws is not None:
        ScriptedDraw(draws)  # refuses what is not a list of picks
    return Case(now, settings, dict(pair), candidates, history, {str(k): dict(v) for k, v in referees.items()},
                None if draws is None else tuple(draws), base)


def load_case(path: str | Path) -> Case:
    """Read a case file.

    Args:
        path: the file.

    Returns:
        The :class:`Case`.

    Raises:
        CaseFileError: it cannot be read, is not JSON, or is not a case.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CaseFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        value = strict_json(raw, str(path))
    except MalformedJSONError as exc:
        raise CaseFileError(str(exc)) from None
    return read_case(value, path.resolve().parent)


def _key_uri(uri: str, base: Path) -> str:
    if uri.startswith("file:") and not uri.startswith("file:/"):
        return "file:" + str((base / uri[len("file:"):]).resolve())
    return uri


@contextlib.contextmanager
def open_seats(case: Case, book: Book) -> Iterator[dict[str, RefereeSeat]]:
    """The case's referee seats (each ``signs: true`` referee's key opened), closed after.

    Args:
        case: the case.
        book: the book whose ledger the seats seal into.

    Returns:
        A context manager giving the seats by node id.

    Raises:
        CaseFileError: a key that cannot be opened.
    """
    from capseal.keys import open_signer

    seats: dict[str, RefereeSeat] = {}
    signers: list[Any] = []
    try:
        for node, spec in case.referee.items():
            if not spec.get("signs"):
                continue
            try:
                signer = open_signer(_key_uri(spec["key"], case.base))
            except (InputError, SignerError) as exc:
                raise CaseFileError(f"the referee's key cannot be opened ({type(exc).__name__}: {exc})",
                                    path=f"$.referee.{node}.key") from None
            signers.append(signer)
            seats[node] = RefereeSeat(node, signer, book.ledger, roster=case.roster, clock=lambda: case.now)
        yield seats
    finally:
        for seat in seats.values():
            seat.close()
        for signer in signers:
            signer.close()


def run_case(case: Case, book: Book, *, reask: bool = False) -> RuleAnswer:
    """Run one case through :class:`Referee`, as the API does.

    Args:
        case: the case.
        book: the book to keep the outcome in (its ledger keeps halves and rulings).
        reask: the operator asks again.

    Returns:
        The :class:`RuleAnswer`.

    Raises:
        PairRefusedError: the pair is refused (nothing recorded).
        CaseFileError: a referee key that cannot be opened.
    """
    pair = case.halves()
    with open_seats(case, book) as seats:
        referee = Referee(
            book, roster=case.roster, settings=case.settings,
            transport=ReplayTransport({n: s.get("reanswer") for n, s in case.referee.items()}),
            seats=seats, history=case.history, clock=lambda: case.now,
            draw=ScriptedDraw(case.draws) if case.draws is not None else None)
        return referee.consider(pair, reask=reask)
