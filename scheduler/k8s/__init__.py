"""The only code that talks to the API server.

- :mod:`.client` - ``ClientSettings``, ``make_api_client``, raw JSON requests and streams
- :mod:`.errors` - the ``KubeError`` tree and ``translate``
- :mod:`.resources` - group/version/plural/scope of each kind and its URL paths (pure)
- :mod:`.watch` - ``Watcher``: list then watch every kind into a cache

Import the submodules directly; this package imports nothing, so pure code (the cache, the
simulator) can use :mod:`.resources` without loading the Kubernetes client.
"""

__all__: list[str] = []
