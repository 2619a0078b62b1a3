"""The fleet: several gateways, one bucket (docs/fleet.md has the protocol).

Services (``node``, ``fence``, ``membership``, ``directory``) with an injected clock; one
edge that speaks to peers (``client``); the peer API (``api``, protocol); the seams the
rest of the gateway sees (``view``, ``transport``) and the messages (``wire``, ``auth``).
Built by the composition root only when peers are configured.
"""
