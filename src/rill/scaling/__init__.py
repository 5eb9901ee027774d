"""Scaling out: several rill replicas behind an ordinary load balancer (nginx), no shared state.

    replica.py   replica names, and the ids a replica hands out that carry its name
    nginx.py     `rill nginx-config`: the nginx configuration that routes by those ids
"""
