"""The operation family's engine.yaml, apart from the implementations' contract (flagperf.operation.impls, which
needs torch): `flagperf validate` checks a manifest where torch is not installed.

``options:`` lists the case keys an implementation reads beyond the contract's (IMPLEMENTATION_OPTIONS): the
plan reads them from the manifest, without importing the implementation (its library may be missing on the
controller), and refuses a value that none of the implementations compared would read."""

from __future__ import annotations

from typing import ClassVar

from pydantic import field_validator

from flagperf.config.engines import EngineManifest, engine_folders, load_engine_manifest

IMPLEMENTATIONS_FOLDER = "operation"  # vendor_images/<vendor>/operation/<implementation>/
INDUCTOR_MODE = "inductor_mode"  # torch.compile's mode: read by an implementation that compiles
IMPLEMENTATION_OPTIONS = (INDUCTOR_MODE,)  # what an implementation's options may list


class ImplementationManifest(EngineManifest):
    module_prefix: ClassVar[str] = "flagperf.operation."

    @field_validator("options")
    @classmethod
    def _options(cls, value: list[str]) -> list[str]:
        for key in value:
            if key not in IMPLEMENTATION_OPTIONS:
                raise ValueError(f"{key!r} is no key an implementation reads (options: "
                                 f"{', '.join(IMPLEMENTATION_OPTIONS)})")
        return value


def implementation_names(vendor: str) -> list[str]:
    """The vendor's implementation folders (every one a case with ``implementations: null`` compares)."""
    return sorted(engine_folders(vendor, IMPLEMENTATIONS_FOLDER))


def checked_implementations(vendor: str, names: list[str], source: str) -> dict[str, ImplementationManifest]:
    """The implementations ``names`` of ``vendor``, each manifest checked (not imported); ``source`` is where
    ``implementations`` was given."""
    return {name: load_engine_manifest(vendor, name, IMPLEMENTATIONS_FOLDER, ImplementationManifest, source,
                                       "implementations")[0] for name in names}

