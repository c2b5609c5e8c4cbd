"""The lookup service: the ASGI app that mounts every served output's routes (lookup/), and the
uvicorn process that runs it."""
