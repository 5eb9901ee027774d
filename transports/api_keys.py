"""API keys: one comparison for every route and both WebSocket listeners.

Both sides are hashed before `hmac.compare_digest`, so the time taken depends on neither the key's
contents nor its length (compare_digest alone returns at once on a length mismatch).
"""

from __future__ import annotations

import hashlib
import hmac

# Routes that stay open when the server requires a key: probes and scrapes. Everything else,
# unknown paths included, needs the key, so a crafted path cannot fall outside a protected prefix.
OPEN_PATHS = frozenset({"/health", "/metrics"})


def bearer_matches(given: str, api_key: str) -> bool:
    """Whether an Authorization header value is `Bearer <api_key>`, in constant time."""
    expected = hashlib.sha256(f"Bearer {api_key}".encode()).digest()
    return hmac.compare_digest(hashlib.sha256(given.encode()).digest(), expected)
