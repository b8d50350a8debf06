"""The federated protocol's contract, the bottom layer of :mod:`gpflow_fed.federated` (no TensorFlow at import):

* :mod:`.messages`: :class:`Message`, the only thing that crosses from a client to the server;
* :mod:`.algorithm`: :class:`Algorithm`, the strategy an engine runs, generic in its server state;
* :mod:`.client`: :class:`Client`, a party's private data;
* :mod:`.transport`: requests and responses, and the :class:`Transport` a runtime implements;
* :mod:`.ledger`: the :class:`CommunicationLedger` of every message that crossed;
* :mod:`.faults`: the fault policy and the screening of replies;
* :mod:`.sampling`, :mod:`.fingerprint`: client sampling, an algorithm's settings digest.
"""
