"""What each rank did: the event record written on the proxy's hot path (``events.py``) and its
export in the Chrome trace event format (``chrome.py``).
"""
