"""Schola GymService protocol: generated messages, space/point codec, gRPC client, errors."""
