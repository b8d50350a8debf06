"""One federated run, the same on every runtime:

* :mod:`.options`: :class:`RunOptions` (progress, evaluation, faults, checkpoints);
* :mod:`.loop`: set-up and the rounds; :mod:`.exchange`: the phase owner, the only code that drives an exchange;
* :mod:`.endpoint`: a party's side of an exchange; :mod:`.checkpoint`: checkpoints and resume;
* :mod:`.result`: :class:`FederatedResult`; :mod:`.factories`: the algorithm factories a remote party trusts.
"""
