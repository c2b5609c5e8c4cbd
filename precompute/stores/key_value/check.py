"""What a key-value version must hold before readers see it (publish and rollback check it).

Redis holds exactly the records the version was created for (a lost or duplicated write shows
here), and every sample (id -> value the job computed) reads back identical.
"""

from __future__ import annotations

from collections.abc import Mapping

from precompute.stores.errors import PublishValidationError
from precompute.stores.key_value import overlay
from precompute.stores.key_value.overlay import Layout
from precompute.stores.key_value.settings import Client, OutputKeys

WRONG_SAMPLES_SHOWN = 5


def stored(client: Client, keys: OutputKeys, layout: Layout) -> int:
    """The records a version holds: its buckets' lengths summed, or an overlay's count."""
    return overlay.count(client, keys, layout) if layout.base else overlay.own_records(client, keys, layout)


def check_holds(client: Client, keys: OutputKeys, layout: Layout, rows: int, samples: Mapping[str, bytes]) -> None:
    """Raise PublishValidationError unless the version holds `rows` records and every sample."""
    fields = []
    for item_id, value in samples.items():
        if not isinstance(item_id, str) or not isinstance(value, bytes):
            raise ValueError(f"samples must map str ids to bytes values, got {item_id!r}: {type(value).__name__}")
        fields.append(item_id.encode())
    count = stored(client, keys, layout)
    pipe = client.pipeline(transaction=False)
    overlay.ask(pipe, keys, layout, fields)
    read = overlay.answers(layout, pipe.execute(), len(fields))
    where = f"version {layout.version!r} of output {keys.output!r}"
    if count != rows:
        raise PublishValidationError(f"{where} holds {count} records, but was created for {rows}")
    wrong = [i for i, got in zip(samples, read, strict=True) if got != samples[i]]
    if wrong:
        raise PublishValidationError(
            f"{where}: {len(wrong)} of {len(samples)} samples read back missing or different, "
            f"e.g. {wrong[:WRONG_SAMPLES_SHOWN]}"
        )
