"""The fixture server's ASGI app served over cleartext HTTP/2 by hypercorn.

``python -m tests.h2_server --port P`` serves ``tests.fixture_server.app`` on
127.0.0.1:P; hypercorn speaks h2c with prior knowledge and accepts
``Upgrade: h2c``, and HTTP/1.1 too. Started and stopped by PID by the tests.
"""
