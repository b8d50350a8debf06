"""The Flower runtime (extra ``flower``, flwr 1.41): a transport over a Flower Grid and the ClientApp.

* :mod:`.server_app`: the ServerApp (:class:`FlowerServer`: discovery, then the shared round loop);
* :mod:`.transport`: :class:`GridTransport`, one stage's requests as Flower messages;
* :mod:`.client_app`: the ClientApp, answering each stage with the party's endpoint;
* :mod:`.records`: the wire format; :mod:`.runtime`: :class:`FlowerRuntime`, the whole Flower path in this process;
  :mod:`.deploy`: a SuperLink and SuperNodes on loopback;
* :mod:`.app_config`: the app's components and run-config keys; :mod:`.commands`: the processes' command lines;
  :mod:`.processes`: every process a command starts, and how they all stop; :mod:`.lifetime`: how long a party's
  SuperNode lives; :mod:`.pace`: a run's exchanges and their time (none of these five imports TensorFlow).
"""
