"""Optional packages and the extra of ``flagperf-prefect`` that installs each.

The default install runs the base-spec cases; data readers, model definitions, inference engines, the
PostgreSQL driver and NVML come with extras, so a missing one must say which extra to install, in one line.
"""

from __future__ import annotations

from flagperf.errors import CaseUserError

DISTRIBUTION = "flagperf-prefect"

# import name -> (package, extra). None: the case family's extra (training and inference both carry it).
OPTIONAL: dict[str, tuple[str, str | None]] = {
    "sklearn": ("scikit-learn", None),
    "PIL": ("pillow", None),
    "transformers": ("transformers", None),
    "onnx": ("onnx", "inference"),
    "onnxruntime": ("onnxruntime", "inference"),
    "mlperf_loadgen": ("mlcommons-loadgen", "inference"),
    "psycopg": ("psycopg", "postgres"),
    "pynvml": ("nvidia-ml-py", "nvidia"),
}
FAMILY_EXTRA = {"training": "training", "inference": "inference"}
DEFAULT_EXTRA = "training"  # a shared package needed outside a training or inference case


class MissingExtra(CaseUserError):
    """An optional package is not installed: the input is fine, the install lacks an extra (not retried)."""

    def __init__(self, package: str, extra: str, needed_by: str | None = None) -> None:
        self.package, self.extra = package, extra
        who = f"{needed_by} needs" if needed_by else "needs"
        super().__init__(f"{who} {package}, which is not installed: {install_command(extra)}")


def install_command(extra: str) -> str:
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def extra_for(import_name: str, family: str | None = None) -> tuple[str, str] | None:
    """(package, extra) for a top-level import name, or None when no extra provides it."""
    known = OPTIONAL.get(import_name.partition(".")[0])
    if known is None:
        return None
    package, extra = known
    return package, extra or FAMILY_EXTRA.get(family or "", DEFAULT_EXTRA)


def missing_extra(exc: ImportError, family: str | None = None, needed_by: str | None = None
                  ) -> MissingExtra | None:
    """The MissingExtra for an import that failed because an extra is not installed, else None (a real bug
    or a broken install is not hidden behind an install hint)."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    found = extra_for(exc.name, family)
    return MissingExtra(found[0], found[1], needed_by) if found else None


def require(import_name: str, family: str | None = None, needed_by: str | None = None) -> None:
    """Fail with the install hint unless ``import_name`` imports."""
    try:
        __import__(import_name)
    except ImportError as exc:
        error = missing_extra(exc, family, needed_by)
        if error is None:
            raise
        raise error from None
