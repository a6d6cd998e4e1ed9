"""Shared implementation of the CPU drivers: numpy-backed memory and a numpy executable format."""
