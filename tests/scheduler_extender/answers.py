"""What the Kubernetes client hands back for a call made with ``_preload_content=False``."""


class Answer:
    """An unread HTTP answer (``_preload_content=False``): its connection is pooled again only
    once it is read to its end and released."""

    def __init__(self) -> None:
        self.read_to_end = self.released = False

    def read(self) -> bytes:
        self.read_to_end = True
        return b'{"kind":"Status","status":"Success"}'

    def release_conn(self) -> None:
        self.released = self.read_to_end
