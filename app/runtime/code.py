"""A model's own Python code: `model.py` in its version's folder, beside its graph
or alone (a model that is only code).

The module may define, each over a micro-batch of requests (a list, one dict of
numpy arrays a request, in order):

- `preprocess(batch)`: the card's inputs to the graph's (and anything the
  postprocess wants to see again);
- `postprocess(batch)`: each request's tensors so far (its inputs, what its
  preprocess made, the graph's outputs) to the card's outputs.

Each returns one item a request, in order: its dict of arrays, or an Exception
that fails that request alone. Either may be left out (the tensors then go on
as they are); a model without a graph needs at least one. BYTES elements reach
the code as `bytes`. A function that raises is called again one request at a
time, so a bad request fails only itself; a call past the card's
`time_limit_seconds` is ended with `CodeTimeLimit` (`limited`). The module is loaded once
per version per process (and again when its file changes), and reads its own
files from `Path(__file__).parent`. It runs only where models run: workers,
never the API process (`app.sync.lane.route` keeps it off the inline route).
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import signal
import sys
import threading
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from app.cards import ModelCard, TensorSpec
from app.runtime.datatypes import V2_TO_NUMPY, is_bytes

logger = logging.getLogger(__name__)

Arrays = dict[str, np.ndarray]
Item = Arrays | Exception
CODE_FILE = "model.py"
FUNCTIONS = ("preprocess", "postprocess")


class CodeError(RuntimeError):
    """The model's code raised, or gave what its card does not declare: one
    request's failure (its type and message), its traceback in the worker's log."""


class CodeTimeLimit(CodeError):
    """A call of the model's code ran past its card's `time_limit_seconds`."""


class CodeNotLoadable(RuntimeError):
    """`model.py` does not import, or defines neither function."""


def load_module(path: Path, ref: str) -> types.ModuleType:
    """Import `path` as a module of its own (never shared with another version)."""
    name = "inference_model_code." + "".join(c if c.isalnum() else "_" for c in ref)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CodeNotLoadable(f"{ref}: {path.name} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (dataclasses and pickle look a class's module up)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise CodeNotLoadable(f"{ref}: {path.name} raised on import: "
                              f"{type(exc).__name__}: {exc}") from exc  # fmt: skip
    if not any(callable(getattr(module, f, None)) for f in FUNCTIONS):
        raise CodeNotLoadable(f"{ref}: {path.name} defines neither preprocess nor postprocess")
    return module


class CodePool:
    """A process's loaded `model.py` modules, one per version, made on first use and
    made again when the file changes; `retain` drops those that stopped serving."""

    def __init__(self) -> None:
        self._modules: dict[str, tuple[int, types.ModuleType]] = {}
        self._lock = threading.Lock()

    def get(self, card: ModelCard) -> types.ModuleType:
        path = card.code_path
        mtime = path.stat().st_mtime_ns
        cached = self._modules.get(card.ref)
        if cached is None or cached[0] != mtime:
            with self._lock:
                cached = self._modules.get(card.ref)
                if cached is None or cached[0] != mtime:
                    cached = (mtime, load_module(path, card.ref))
                    self._modules[card.ref] = cached
                    logger.info("loaded the code of model %s", card.ref)
        return cached[1]

    def loaded(self) -> list[str]:
        return list(self._modules)

    def retain(self, serving: set[str]) -> list[str]:
        with self._lock:
            gone = [ref for ref in self._modules if ref not in serving]
            for ref in gone:
                sys.modules.pop(self._modules.pop(ref)[1].__name__, None)
        if gone:
            logger.info("dropped the code of %s: no longer serving", ", ".join(sorted(gone)))
        return gone


# The one pool of a process: code is loaded where it runs, whoever asks.
CODE = CodePool()


def retain(serving: set[str]) -> None:
    CODE.retain(serving)


Graph = Callable[[list[Arrays]], list[Item]]


def infer(card: ModelCard, requests: list[Arrays], graph: Graph | None) -> list[Item]:
    """One outcome a request: the card's outputs, or the exception that ended it.
    `graph` runs the model's graph on a micro-batch (None: a model of code alone)."""
    module = CODE.get(card)
    limit = card.time_limit_s
    items: list[Item] = [{k: _as_bytes(v) for k, v in r.items()} for r in requests]
    items = _stage(module, "preprocess", items, limit)
    if graph is not None:
        ready = [i for i, item in enumerate(items) if not isinstance(item, Exception)]
        ran = graph([items[i] for i in ready]) if ready else []  # type: ignore[misc]
        for i, out in zip(ready, ran, strict=True):
            item = items[i]
            assert not isinstance(item, Exception)
            items[i] = out if isinstance(out, Exception) else {**item, **out}
    items = _stage(module, "postprocess", items, limit)
    return [item if isinstance(item, Exception) else _outputs(card, item) for item in items]


def _stage(module: types.ModuleType, name: str, items: list[Item], limit: float) -> list[Item]:
    """`module.<name>` over the items still running (all at once; one at a time
    where the call raised); the failed ones stay as they are."""
    function = getattr(module, name, None)
    if not callable(function):
        return items
    live = [i for i, item in enumerate(items) if not isinstance(item, Exception)]
    if not live:
        return items
    out = list(items)
    try:
        results = _call(function, name, [items[i] for i in live], limit)
    except CodeError as exc:
        if len(live) == 1:
            out[live[0]] = exc
            return out
        for i in live:  # one at a time: the bad request fails alone
            try:
                [out[i]] = _call(function, name, [items[i]], limit)
            except CodeError as alone:
                out[i] = alone
        return out
    for i, result in zip(live, results, strict=True):
        out[i] = result
    return out


def _call(function: Callable[..., Any], name: str, batch: list[Item], limit: float) -> list[Item]:
    """`function(batch)`, checked: one dict (or Exception) a request, in order."""
    try:
        results = limited(function, batch, limit, f"model.py {name}")
    except CodeTimeLimit:
        raise
    except Exception as exc:
        logger.warning("model.py %s raised on %d request(s)", name, len(batch), exc_info=True)
        raise CodeError(f"model.py {name}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(results, list | tuple) or len(results) != len(batch):
        got = f"{len(results)} items" if isinstance(results, list | tuple) else type(results)
        raise CodeError(f"model.py {name} returned {got} for {len(batch)} requests; it "
                        "returns one dict of arrays (or an Exception) a request")  # fmt: skip
    checked: list[Item] = []
    for result in results:
        if isinstance(result, Exception):
            checked.append(CodeError(f"model.py {name}: {type(result).__name__}: {result}"))
        elif isinstance(result, dict):
            checked.append({str(k): np.asarray(v) if not isinstance(v, np.ndarray) else v
                            for k, v in result.items()})  # fmt: skip
        else:
            checked.append(CodeError(f"model.py {name} returned a {type(result).__name__} for a "
                                     "request; it returns a dict of arrays"))  # fmt: skip
    return checked


def _outputs(card: ModelCard, item: Arrays) -> Item:
    """The card's outputs of a request, in their declared datatypes and ranks."""
    out: Arrays = {}
    for spec in card.outputs:
        if spec.name not in item:
            return CodeError(f"model.py gave no output {spec.name!r}; the card declares "
                             f"{[s.name for s in card.outputs]}")  # fmt: skip
        try:
            out[spec.name] = conform(spec, item[spec.name])
        except (TypeError, ValueError) as exc:
            return CodeError(f"model.py's output {spec.name!r}: {exc}")
    return out


def conform(spec: TensorSpec, value: Any) -> np.ndarray:
    """`value` as `spec`'s datatype and rank (ValueError says what does not fit)."""
    array = np.asarray(value, dtype=object if is_bytes(spec.datatype) else None)
    if is_bytes(spec.datatype):
        if not all(isinstance(v, str | bytes) for v in array.reshape(-1)):
            raise ValueError(f"a {spec.datatype} tensor holds str or bytes")
    else:
        if array.dtype.kind not in "biuf":
            raise ValueError(f"holds {array.dtype}, not {spec.datatype} values")
        array = array.astype(V2_TO_NUMPY[spec.datatype], copy=False)
    if array.ndim != len(spec.shape) or any(
        want >= 0 and got != want for got, want in zip(array.shape, spec.shape, strict=True)
    ):
        raise ValueError(f"has shape {list(array.shape)}; the card declares {list(spec.shape)}")
    return array


def _as_bytes(array: np.ndarray) -> np.ndarray:
    """A BYTES tensor's text elements as UTF-8 `bytes`: the code sees one type."""
    if array.dtype != object:
        return array
    out = np.empty(array.shape, dtype=object)
    for index, item in np.ndenumerate(array):
        out[index] = item.encode() if isinstance(item, str) else item
    return out


def limited(function: Callable[[Any], Any], argument: Any, seconds: float, what: str) -> Any:
    """`function(argument)`, ended with CodeTimeLimit past `seconds`. In a process's
    main thread (a worker child's task) a timer signal interrupts it, even in a
    sleep. Elsewhere (the lane's threads) it runs in a thread of its own that is
    waited for that long: the caller goes on, and the thread is told to stop at
    its next Python step. Code stuck in C beyond that ends with its process (the
    job's hard time limit)."""
    if seconds <= 0:
        return function(argument)
    if threading.current_thread() is threading.main_thread() and _alarm_free():
        with _by_signal(seconds, what):
            return function(argument)
    return _in_thread(function, argument, seconds, what)


def _alarm_free() -> bool:
    return signal.getitimer(signal.ITIMER_REAL)[0] == 0


@contextmanager
def _by_signal(seconds: float, what: str) -> Iterator[None]:
    def expired(signum: int, frame: Any) -> None:
        raise CodeTimeLimit(f"{what} ran past its time limit of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _in_thread(function: Callable[[Any], Any], argument: Any, seconds: float, what: str) -> Any:
    outcome: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            outcome.append((True, function(argument)))
        except _AsyncTimeLimit:
            pass
        except BaseException as exc:
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name=f"code {what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive() or not outcome:
        if thread.ident is not None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(thread.ident), ctypes.py_object(_AsyncTimeLimit)
            )
        raise CodeTimeLimit(f"{what} ran past its time limit of {seconds:g} s")
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


class _AsyncTimeLimit(BaseException):
    """Raised in a lane thread by its watchdog (a BaseException: code's own `except
    Exception` does not swallow it)."""


def has_code(folder: Path) -> bool:
    return (folder / CODE_FILE).is_file()
