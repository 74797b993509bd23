"""Helpers behind the fixtures of tests/conftest.py: a real sshd on loopback, real SGLang venvs."""
