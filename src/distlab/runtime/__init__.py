"""Launching ranks, the communicator proxy, what each rank is blocked on, and supervision."""
