"""Loading workloads by name: a zoo model, or a user's ``module:function``.

One loader serves every place that takes a workload by name (the CLI's ``trace``, ``plan`` and
``launch``, :func:`autoplan.exec.launch`, the launch workers and the Explorer), so a spec means
the same everywhere and can travel to another process as JSON.

A *spec* is

* a zoo model name, ``"gpt"`` (with ``size=``, ``batch=`` and config overrides, as
  :func:`autoplan.models.get` takes them);
* ``"module:function"`` (uvicorn's ``module:app`` convention; dotted attributes after the colon
  are followed): the function is imported and called with the keyword arguments given (the CLI's
  ``--set KEY=VALUE``, and ``--size``/``--batch`` when given). It returns an
  :class:`autoplan.Workload` or any object with ``fn`` (the training step) and ``args``
  (its positional arguments); ``arg_kinds`` and ``name`` are optional. ``"module:name"`` may
  also name such an object directly;
* a dict ``{"model": name_or_module_function, **kwargs}`` (the JSON form sent to workers).

Concrete data. Planning needs only shapes; running needs arrays. The function may therefore
declare an ``abstract`` parameter (and a ``seed`` one): it is called with ``abstract=True`` to
plan and ``abstract=False, seed=s`` to run, like :func:`autoplan.models.get`. A function without
an ``abstract`` parameter returns one thing for both: concrete arrays (simplest), or
``jax.ShapeDtypeStruct`` leaves from an object with a ``concrete(seed)`` method. Every worker of
a launch calls the function itself, so it must build the same arrays in every process: seed
every random generator (the launcher compares a digest of each worker's arrays and stops a
launch whose workers disagree).

Module search path. As uvicorn does, the current directory is put on ``sys.path`` (first) when
it is not there already, so ``autoplan plan mypkg.train:workload`` finds ``./mypkg`` from the
console script too; once the module is imported it stays on the path but behind the standard
library and the installed packages (a ``queue.py`` beside the workload then does not stand in
for the standard library's in what is imported later); the launcher hands this process's
``sys.path`` to its workers.

Example:
    >>> wl = load_workload("gpt", size="tiny", layers=1)
    >>> workload_spec(wl)
    {'model': 'gpt', 'size': 'tiny', 'layers': 1}
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from autoplan._errors import ModelError

if TYPE_CHECKING:
    from autoplan.tracing._workload import Workload

__all__ = ["load_workload", "workload_spec", "parse_spec", "is_function_spec",
           "source_files", "shadowed_stdlib"]

_FUNCTION_SPEC = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def is_function_spec(name: Any) -> bool:
    """True for a ``"module:function"`` string (a zoo name has no colon)."""
    return isinstance(name, str) and ":" in name


def parse_spec(spec: Any, **kwargs: Any) -> dict[str, Any]:
    """The JSON form ``{"model": name, **kwargs}`` of a spec.

    Args:
        spec: a zoo name, ``"module:function"``, or a dict with a ``"model"`` key.
        **kwargs: more keyword arguments (those whose value is None are dropped, so CLI options
            left unset do not reach the function).

    Raises:
        ModelError: the spec is none of those forms, a ``module:function`` string is malformed,
            or a value is not JSON.
    """
    if isinstance(spec, Mapping):
        d = dict(spec)
        if "model" not in d:
            raise ModelError(f"workload spec should have a 'model' key. Got keys {sorted(d)}. Fix: "
                             "pass {'model': 'gpt', 'size': 'tiny'} or {'model': 'pkg.mod:fn'}.")
    elif isinstance(spec, str):
        d = {"model": spec}
    else:
        raise ModelError(f"workload spec should be a zoo model name, 'module:function', or a dict "
                         f"with a 'model' key. Got {type(spec).__name__}: {spec!r:.80}. Fix: e.g. "
                         "'gpt' or 'mypkg.train:workload'.")
    d.update({k: v for k, v in kwargs.items() if v is not None})
    name = d["model"]
    if not isinstance(name, str) or not name:
        raise ModelError(f"workload spec's 'model' should be a non-empty string. Got {name!r}. Fix: "
                         "a zoo name such as 'gpt', or 'mypkg.train:workload'.")
    if is_function_spec(name) and not _FUNCTION_SPEC.fullmatch(name):
        raise ModelError(f"a user workload should be written 'module:function' (dotted module path, "
                         f"one colon, a function name). Got {name!r}. Fix: e.g. "
                         "'mypkg.train:workload' for the function workload in mypkg/train.py.")
    out = {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}
    try:
        json.dumps(out)
    except (TypeError, ValueError) as err:
        raise ModelError(f"workload spec values should be JSON values (numbers, strings, lists, "
                         f"dicts, booleans). Got {d!r:.200} ({err}). Fix: pass plain values; a "
                         "function can build anything else from them.") from err
    return out


def __getattr__(name: str) -> Any:
    """``LoadedWorkload``: the type :func:`load_workload` returns, :class:`autoplan.Workload`
    (the one workload type; its ``origin`` says ``"function"`` for a ``module:function``),
    imported on first use (this module loads without JAX)."""
    if name == "LoadedWorkload":
        from autoplan.tracing._workload import Workload  # noqa: PLC0415

        return Workload
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _is_workload_like(obj: Any) -> bool:
    from autoplan.tracing._workload import is_workload_like  # noqa: PLC0415

    return is_workload_like(obj)


def load_workload(spec: Any, *, abstract: bool = True, seed: int = 0, **kwargs: Any) -> Workload:
    """The workload a spec names.

    Args:
        spec: a zoo model name, ``"module:function"``, a dict ``{"model": ..., **kwargs}``, or a
            workload object (an :class:`autoplan.Workload` is returned as it is, anything else
            with ``fn`` and ``args`` wrapped as one).
        abstract: shapes only (``jax.ShapeDtypeStruct``) where the workload can give them; False:
            concrete arrays initialised from ``seed``.
        seed: PRNG seed of concrete arrays.
        **kwargs: for a zoo model ``size``, ``batch`` and config overrides; for a function its
            keyword arguments. None values are ignored.

    Returns:
        An :class:`autoplan.Workload` whose ``origin`` is the zoo model and size, the
        ``"module:function"`` and its keyword arguments, or (for an object) ``"object"``.

    Raises:
        ModelError: an unknown zoo name, a module that cannot be imported, a missing function,
            keyword arguments the function does not take, a result without ``fn`` and ``args``,
            an error raised by the function, or (``abstract=False``) no way to make concrete data.
    """
    if not isinstance(abstract, bool):
        raise ModelError(f"abstract should be True or False. Got {abstract!r}. Fix: abstract=True.")
    if not isinstance(spec, (str, Mapping)):
        if _is_workload_like(spec):
            return _as_workload(spec, None, abstract, seed)
        parse_spec(spec)  # raises the error for a wrong type
    d = parse_spec(spec, **kwargs)
    name = d.pop("model")
    if not is_function_spec(name):
        from autoplan import models  # noqa: PLC0415 - the zoo imports JAX and the model code

        zoo = models.list_models()
        if name not in zoo:
            raise ModelError(
                f"workload should be a zoo model name ({', '.join(zoo)}) or a user's "
                f"'module:function'. Got {name!r}. Fix: pass one of those names, or "
                "'mypkg.train:workload' for a function workload() in mypkg/train.py that returns "
                "an object with fn and args.")
        size = d.pop("size", None) or "tiny"
        batch = d.pop("batch", None)
        return models.get(name, size, batch, abstract=abstract, seed=seed, **d)
    target = _resolve(name)
    spec_d = {"model": name, **d}
    if _is_workload_like(target):
        if d:
            raise ModelError(f"{name!r} is a workload object, not a function, so it takes no "
                             f"arguments. Got {sorted(d)}. Fix: drop them (--set, --size, --batch), "
                             "or make it a function that builds the workload from them.")
        return _as_workload(target, spec_d, abstract, seed)
    if not callable(target):
        raise ModelError(f"{name!r} should be a function returning a workload (an object with fn "
                         f"and args), or such an object. Got {type(target).__name__}. Fix: point "
                         "the spec at the function.")
    call = dict(d)
    params = _parameters(target)
    if params is not None:
        if "abstract" in params:
            call["abstract"] = abstract
        if "seed" in params:
            call["seed"] = seed
        _check_call(name, target, call)
    try:
        result = target(**call)
    except ModelError:
        raise
    except Exception as err:  # the user's own code: say where it failed
        raise ModelError(f"workload function {name!r} raised {type(err).__name__}: {err}"
                         f"{_where(err)}. Fix: correct the function (the traceback is chained "
                         "below).") from err
    if not _is_workload_like(result):
        raise ModelError(f"workload function {name!r} should return an autoplan.models.Workload "
                         f"or an object with fn (the training step) and args (its arguments). "
                         f"Got {type(result).__name__}: {result!r:.80}. Fix: return e.g. "
                         "types.SimpleNamespace(fn=train_step, args=(params, opt_state, batch)).")
    return _as_workload(result, spec_d, abstract if "abstract" not in call else None, seed)


def workload_spec(workload: Any) -> dict[str, Any] | None:
    """The JSON spec that loads ``workload`` again in another process, or None.

    A dict or string spec is normalised; an :class:`autoplan.Workload` gives its
    :attr:`~autoplan.Workload.spec` (a zoo workload its name, size and the config fields that
    differ from the size's defaults; a loaded one its ``module:function`` and keyword arguments);
    anything else (a workload built in this process only) has none.
    """
    if isinstance(workload, (str, Mapping)):
        return parse_spec(workload)
    from autoplan.tracing._workload import Workload  # noqa: PLC0415

    if isinstance(workload, Workload):
        spec = workload.spec
        return None if spec is None else parse_spec(spec)
    return None


def source_files(name: Any) -> list[str]:
    """The files a ``"module:function"`` workload is read from, found without importing it: the
    module's file, and every file directly in the folder of each package on its dotted path
    (their ``__init__.py`` and the module's siblings). Empty
    for a zoo name, or a module that cannot be found (loading it says why).

    The command line compares its output paths with these, so that ``-o`` never replaces the
    user's own source.
    """
    if not is_function_spec(name):
        return []
    from importlib.machinery import PathFinder  # noqa: PLC0415

    parts = name.partition(":")[0].split(".")
    search = [os.getcwd(), *[p or os.getcwd() for p in sys.path]]
    files: list[str] = []
    for part in parts:
        try:
            spec = PathFinder.find_spec(part, search)
        except (ImportError, OSError, ValueError):
            return files
        if spec is None:
            return files
        origin = spec.origin if spec.has_location else None
        if origin:
            files.append(origin)
        locations = list(spec.submodule_search_locations or ())
        if not locations:
            break
        search = locations
        for folder in locations:  # a package: the files in its folder
            try:
                with os.scandir(folder) as it:
                    files += [e.path for e in it if e.is_file()]
            except OSError:
                pass
    return sorted(set(files))


def shadowed_stdlib() -> list[tuple[str, str]]:
    """``(module, path)`` of the files on ``sys.path``, ahead of the standard library, that an
    import of one of its modules would find first (a ``queue.py`` in the current folder): they
    break the command itself when its folder is ``sys.path[0]``, and every spawned worker."""
    stdlib = os.path.dirname(os.__file__)
    names = getattr(sys, "stdlib_module_names", frozenset())
    found: list[tuple[str, str]] = []
    for entry in sys.path:
        folder = os.path.abspath(entry or os.getcwd())
        if folder == stdlib:
            break
        if folder.startswith(sys.base_prefix) or folder.startswith(sys.prefix):
            continue  # (the interpreter's own folders and site-packages)
        try:
            with os.scandir(folder) as it:
                for e in it:
                    name = e.name[:-3] if e.name.endswith(".py") else e.name
                    if name in names and not name.startswith("_") and (
                            e.name.endswith(".py") or os.path.isfile(os.path.join(e.path, "__init__.py"))):
                        found.append((name, e.path))
        except OSError:
            continue
    return found



# ---- loading -------------------------------------------------------------------------------
def _resolve(name: str) -> Any:
    module_name, _, attrs = name.partition(":")
    cwd = os.getcwd()
    added = "" not in sys.path and cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        missing = err.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise ModelError(
                f"workload {name!r}: no module named {missing!r} in the current directory "
                f"({cwd}) or on sys.path (PYTHONPATH). Fix: run from the folder that holds "
                f"{module_name.split('.')[0]!r}, or add that folder to PYTHONPATH.") from err
        raise ModelError(f"workload {name!r}: importing module {module_name!r} failed: "
                         f"ModuleNotFoundError: {err}. Fix: install the package it needs.") from err
    except Exception as err:
        raise ModelError(f"workload {name!r}: importing module {module_name!r} raised "
                         f"{type(err).__name__}: {err}{_where(err)}. Fix: correct the module.") from err
    finally:
        if added and cwd in sys.path:
            # (kept, but behind the standard library and the installed packages: a user's
            # queue.py beside the workload would otherwise stand in for the standard library's
            # in every module this process, and its workers, import later)
            sys.path.remove(cwd)
            sys.path.append(cwd)
    obj: Any = module
    for part in attrs.split("."):
        if not hasattr(obj, part):
            defined = sorted(k for k, v in vars(module).items()
                             if callable(v) and not k.startswith("_")
                             and getattr(v, "__module__", None) == module.__name__)
            raise ModelError(f"workload {name!r}: module {module_name!r} has no attribute {part!r}. "
                             f"Functions it defines: {defined}. Fix: name one of them after the "
                             "colon.")
        obj = getattr(obj, part)
    return obj


def _parameters(fn: Callable[..., Any]) -> dict[str, inspect.Parameter] | None:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin or C callable: call it and see
        return None


def _check_call(name: str, fn: Callable[..., Any], call: Mapping[str, Any]) -> None:
    try:
        inspect.signature(fn).bind(**call)
    except TypeError as err:
        sig = inspect.signature(fn)
        unknown = [k for k in call if k not in sig.parameters]
        takes_var = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
        what = (f"keyword argument(s) {unknown} it does not take" if unknown and not takes_var
                else f"arguments it cannot bind ({err})")
        raise ModelError(f"workload function {name}{sig} was given {what}. Fix: pass only its "
                         "parameters (--set KEY=VALUE, --size, --batch), or add them to the "
                         "function.") from err


def _where(err: BaseException) -> str:
    tb = err.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    if last is None:
        return ""
    code = last.tb_frame.f_code
    return f" (at {code.co_filename}:{last.tb_lineno} in {code.co_name})"


def _as_workload(obj: Any, spec: dict[str, Any] | None, abstract: bool | None,
                 seed: int) -> Workload:
    """``obj`` as a :class:`Workload`; with ``spec``, one whose origin is that
    ``module:function`` (named ``spec["model"]``, made concrete by calling it again).

    ``abstract`` None: the function already chose (it took an ``abstract`` argument). True: keep
    what the object gives. False: make concrete arrays when the object gives shapes.
    """
    from autoplan.tracing._workload import Origin, Workload, as_workload  # noqa: PLC0415

    label = spec["model"] if spec is not None else None
    wl = as_workload(obj, f"workload {label!r}" if label else "workload")
    if abstract is False and wl.abstract:
        if wl.init is None:
            raise ModelError(
                f"workload {label or wl.name!r} has abstract (jax.ShapeDtypeStruct) arguments and "
                "no way to make concrete ones, which running it needs. Fix: give the function an "
                "'abstract' parameter (called with abstract=False, seed=... to run), return "
                "concrete arrays, or give the returned object a concrete(seed) method.")
        wl = wl.concrete(seed)
    if spec is None:
        return wl
    kwargs = {k: v for k, v in spec.items() if k != "model"}
    # the object's own config when it has one (a Workload always does), else the function's
    # keyword arguments
    own = obj.config if isinstance(obj, Workload) else getattr(obj, "config", None)
    config = dict(wl.config) if isinstance(own, Mapping) else kwargs

    def init(seed: int) -> tuple[Any, ...]:
        return load_workload(spec, abstract=False, seed=seed).args

    return Workload(wl.fn, wl.args, wl.arg_kinds, label, config=config, init=init,
                    loss_fn=wl.loss_fn, origin=Origin("function", label, None, kwargs))
