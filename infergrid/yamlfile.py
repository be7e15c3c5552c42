"""Reading a YAML (or JSON) file, with failures reported as ContractError."""

from pathlib import Path

import yaml

from infergrid.errors import ContractError


def read_yaml(path: str | Path) -> object:
    """The document in ``path``; a missing or malformed file is bad input, not a crash."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or error
        raise ContractError(str(path), f"cannot read: {reason}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ContractError(str(path), f"not valid YAML: {' '.join(str(error).split())}") from None
