"""The one error type for bad input anywhere in the contract."""


class ContractError(ValueError):
    """Input that breaks the contract, with the path of the offending field.

    Callers print it as-is ("<field>: <reason>"), so a person can find and fix
    the field without reading a traceback.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason
