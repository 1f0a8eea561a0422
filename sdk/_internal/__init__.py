"""capseal's internal modules: not a public API, not subject to any stability
guarantee. Only the ``capseal`` package itself (and its tests) imports them.

``sealing`` (a capsule from a spec: assemble, prepare, complete), ``lifecycle``
(what one action's capsules carry from one to the next), ``writer`` (records
into the ledger in order: epoch pairing, parent before child), ``pipeline``
(signing on a device outside the GIL), ``inputs`` (checks of plain arguments),
``switch`` (the plain-path switch as the core reads it).
"""
