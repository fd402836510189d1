"""Where an HTTP server listens: the one `listen:` section of the agent and of the aggregator.

Its own module because core/config.py embeds core/config_aggregator.py, which must not import it
back. Each embedding field gives its own defaults (agent 0.0.0.0:9410, aggregator 127.0.0.1:9420);
a file that sets only one key keeps the other from that field's default (configload.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from podhealth.configload import NonEmpty, Port, doc


@dataclass(frozen=True)
class ListenConfig:
    address: Annotated[str, NonEmpty()] = doc("Address the HTTP server binds.", "0.0.0.0")
    port: Port = doc("Port of the HTTP server (0 = pick a free one).", 9410)
