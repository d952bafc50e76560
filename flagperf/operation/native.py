"""The native implementation: the operator's torch call as it is (the baseline every speed-up is against)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from flagperf.operation.impls import OperatorImplementation
from flagperf.operation.operators import Operator


class Implementation(OperatorImplementation):
    """torch's own operators (the baseline)"""

    def prepare(self, op: Operator, dtype: str, native: Callable[..., Any]) -> Callable[..., Any]:
        return native

    def describe(self) -> str:
        return f"torch {torch.__version__}'s own operators (the baseline)"
