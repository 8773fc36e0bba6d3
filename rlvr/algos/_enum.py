"""``StrEnum`` on every supported Python (3.10 has no ``enum.StrEnum``)."""

try:
    from enum import StrEnum
except ImportError:  # Python 3.10
    from enum import Enum

    class StrEnum(str, Enum):  # type: ignore[no-redef]
        def __str__(self) -> str:
            return str(self.value)


__all__ = ["StrEnum"]
