"""The contract between the service core and a backend (contract.py), and the plain data they
exchange: requests and their events, sampling settings, sessions, prompt layout, the status view.

Nothing here imports llama.cpp: remote mode serves with this package and never loads it (a test
checks), and the transports can build requests without touching native code.
"""
