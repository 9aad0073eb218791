"""Request bodies decoded, or the 400 that says what is wrong with them and where.

Every body the proxy reads, on a paged API or its own, goes through
``decode_json``: what is not JSON, not of the expected shape, not UTF-8, or
nested past what a decoder can follow is the request's fault, never a 500.
A number no JSON decoder reads as a number (``1e999``: infinite as a double;
an integer of thousands of digits) is a 400 that names its field, wherever
it is in a paged API's body (``finite_fields``): the proxy never sends one
upstream, nor reads one from the upstream as a number (``strict_json``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection
from typing import Any, TypeVar

import msgspec

from .errors import ClientError

__all__ = ["INT64", "decode_json", "decode_stored", "error_param", "finite_fields", "not_utf8", "out_of_range", "strict_json"]

T = TypeVar("T")


def decode_json(body: bytes, decode: Callable[[bytes], T], what: str = "chat request", code: str | None = None, field: str | None = None) -> T:
    """``decode(body)``, or the 400 that says what is wrong with the body (``code``: the code of one of the wrong shape).

    Besides what is not JSON or not of the API's shape, msgspec refuses text
    that is not UTF-8 and raises RecursionError past some thousand levels of
    nesting: both are the request's fault, not the proxy's. ``body`` may be
    one field of the request (``field``, its name): the error names it. Text
    that is not UTF-8 is named by where it is (``messages.[2].content``).
    """
    try:
        return decode(body)
    except msgspec.ValidationError as exc:
        text = str(exc)
        if text.startswith(OUT_OF_RANGE):
            raise _number_error(body, what, field, error_param(text), code) from None
        raise ClientError(f"invalid {what}: {text}", param=_within(field, error_param(text)), code=code) from None
    except msgspec.DecodeError as exc:
        # msgspec 0.23 refuses text that is not UTF-8 with a DecodeError ("Invalid UTF-8 encoded string"),
        # where earlier releases raised UnicodeDecodeError: either way the error names where it is.
        if not _is_utf8(body):
            raise _not_utf8_error(body, field) from None
        raise ClientError(f"{f'`{field}`' if field else 'request body'} is not valid JSON: {exc}", param=field) from None
    except UnicodeDecodeError:
        raise _not_utf8_error(body, field) from None
    except RecursionError:
        raise ClientError("request body is nested too deeply: JSON arrays and objects within each other, a thousand levels or so", code="too_deep") from None


# msgspec's messages for a number past a double's range (``1e999``), and an integer past what Python converts (4,300 digits).
OUT_OF_RANGE = ("Number out of range", "Integer value out of range")
_FIELDS = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ANY = msgspec.json.Decoder()


def strict_json(text: bytes | str) -> Any:
    """``text`` decoded as strict JSON: ``NaN``, ``Infinity`` and a number past a double's range (``1e999``) are
    refused (a ``ValueError``, as ``json.loads`` raises for what is not JSON), where ``json.loads`` reads them as
    floats that ``json.dumps`` writes back as ``Infinity``, which is not JSON."""
    return _ANY.decode(text)


def finite_fields(body: bytes, decoded: Collection[str], what: str) -> None:
    """The 400 for a number out of range in ``body``'s fields but those its reader ``decoded`` (where ``decode_json``
    found one): a field the proxy does not read (``temperature``, a tool's schema) is checked too, so that what goes
    upstream, forwarded or paged, is JSON every decoder reads. A body that is not a JSON object is its reader's to refuse.

    One pass over the body's bytes and a decode of the fields it does not read (small beside a history)."""
    try:
        fields = _FIELDS.decode(body)
    except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
        return
    for key, raw in fields.items():
        if key not in decoded and _out_of_range(raw):
            raise _number_error(bytes(raw), what, key, None)


def _out_of_range(raw: bytes | msgspec.Raw) -> bool:
    """Whether ``raw`` holds an integer past 64 bits."""
    try:
        _ANY.decode(raw)
    except msgspec.ValidationError as exc:
        return str(exc).startswith(OUT_OF_RANGE)
    except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):  # text not UTF-8, nesting: not a number's fault
        return False
    return False


def _number_error(body: bytes, what: str, field: str | None, reported: str | None, code: str | None = None) -> ClientError:
    """The 400 for a number out of range in ``body`` (``field``, when it is one field of the request), naming where it is
    (``reported``: where msgspec found it, when it cannot be found); ``code``: the caller's, for a body of the wrong shape."""
    found = out_of_range_at(body)
    where = _within(field, found[0] if found is not None else reported)
    place = f"`{where}`" if where else "the body"
    said_number = f"{place} is {_token(found[1])}" if found is not None else f"a number in {place} is"
    return ClientError(
        f"invalid {what}: {said_number} out of range: JSON numbers here must be finite (within a double's ±1.8e308) and integers shorter than 4,300 digits",
        param=where,
        code=code or "number_out_of_range",
    )


def out_of_range_at(body: bytes, depth: int = 32) -> tuple[str, bytes] | None:
    """Where in the JSON ``body`` a number out of range is, written as OpenAI writes ``param`` (``messages.[2].weight``,
    "" for the body itself), and the number as it was written; None when there is none (or past ``depth`` levels)."""
    return _first(body, _out_of_range, depth)


def _first(body: bytes, bad: Callable[[bytes], bool], depth: int) -> tuple[str, bytes] | None:
    """Where in the JSON ``body`` the first value is for which ``bad`` holds, followed down ``depth`` levels through
    object keys and array items (``messages.[2].content``; "" for the body itself), and that value's text."""
    for shape, name in ((dict[str, msgspec.Raw], "{}"), (list[msgspec.Raw], "[{}]")):
        try:
            items = msgspec.json.decode(body, type=shape)
        except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
            continue
        pairs: Any = items.items() if isinstance(items, dict) else enumerate(items)
        for key, raw in pairs:
            if bad(bytes(raw)):
                deeper = _first(bytes(raw), bad, depth - 1) if depth > 0 else None
                here = name.format(key)
                return (".".join(filter(None, (here, deeper[0]))), deeper[1]) if deeper is not None else (here, bytes(raw))
        return None
    return ("", body.strip()) if bad(body) else None


def _token(number: bytes) -> str:
    """A number as an error names it: whole when short, else by its length."""
    text = number.decode(errors="replace")
    return f"{text}," if len(text) <= 32 else f"a number of {len(text):,} characters ({text[:12]}…),"


def _not_utf8_error(body: bytes, field: str | None) -> ClientError:
    """The 400 for a body whose text is not UTF-8, naming the field that holds it."""
    where = _within(field, not_utf8(body))
    message = f"`{where}` is not valid UTF-8" if where else "request body is not valid UTF-8"
    return ClientError(f"{message} ({_bad_utf8(body)}{' of the field' if field else ''})", param=where, code="invalid_encoding")


def _is_utf8(body: bytes) -> bool:
    """Whether ``body`` decodes as UTF-8."""
    try:
        body.decode()
    except UnicodeDecodeError:
        return False
    return True


def _within(field: str | None, param: str | None) -> str | None:
    """A parameter's path within ``field`` (None: neither names one)."""
    return ".".join(filter(None, (field, param))) or None


def not_utf8(body: bytes, depth: int = 12) -> str | None:
    """Where in the JSON ``body`` text is not UTF-8, written as OpenAI writes ``param`` (``messages.[2].content``):
    the first object key or array item that holds it, followed down ``depth`` levels; None: the body is not a JSON
    object or array, or a key itself is not UTF-8."""
    found = _first(body, lambda raw: not _is_utf8(raw), depth)
    return found[0] or None if found is not None else None


# What a store keeps of a number: msgpack and Redis take a signed 64-bit integer, and a finite float.
INT64 = (-(2**63), 2**63 - 1)


def decode_stored(body: bytes, decode: Callable[[bytes], T], what: str, code: str | None = None) -> T:
    """``decode_json``, and the 400 for a number in it that no store keeps (an integer past 64 bits, a float not finite).

    JSON integers have no size; a value past 64 bits was once accepted, then lost
    when its save failed (msgpack raised OverflowError, Redis a 500).
    """
    value = decode_json(body, decode, what, code)
    problem = out_of_range(value)
    if problem is not None:
        path, number = problem
        raise ClientError(
            f"invalid {what}: {path} is {_shown(number)}, past what is stored (a whole number within ±2^63, a finite float)",
            param=path or None,
            code="number_out_of_range",
        )
    return value


def out_of_range(value: Any, path: str = "") -> tuple[str, Any] | None:
    """Where in ``value`` (decoded: Structs, lists, dicts) a number lies that a store cannot keep, and the number."""
    if isinstance(value, bool) or value is None or isinstance(value, str | bytes):
        return None
    if isinstance(value, int):
        return None if INT64[0] <= value <= INT64[1] else (path, value)
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, value)
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    elif hasattr(value, "__struct_fields__"):
        items = ((name, getattr(value, name)) for name in value.__struct_fields__)
    else:
        return None
    for key, item in items:
        found = out_of_range(item, f"{path}.{key}" if path and not isinstance(key, int) else f"{path}[{key}]" if isinstance(key, int) else str(key))
        if found is not None:
            return found
    return None


def _shown(number: Any) -> str:
    """A number as an error shows it: whole, or by its digits when it is huge."""
    text = str(number) if not isinstance(number, int) or abs(number) < 10**30 else f"a {len(str(abs(number)))}-digit number"
    return text


def _bad_utf8(body: bytes) -> str:
    """Where ``body`` stops being UTF-8, as an error says it."""
    try:
        body.decode()
    except UnicodeDecodeError as exc:
        return f"byte 0x{body[exc.start]:02x} at offset {exc.start}"
    return "in a string"  # not reached: msgspec found what Python finds


# msgspec ends a message with where it failed: "… - at `$.messages[0].role`".
_AT = re.compile(r"at `\$\.([^`]*)`$")
_MISSING = re.compile(r"missing required field `([^`]*)`")


def error_param(message: str) -> str | None:
    """The field a validation error is about, written as OpenAI writes ``param`` (``messages.[0].role``)."""
    at = _AT.search(message) or _MISSING.search(message)
    return at.group(1).replace("[", ".[") if at else None
