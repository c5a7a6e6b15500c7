"""The game clients: `GymClient` (the session, deadlines, errors) over a transport, gRPC
Python's (`grpcio_transport`) or uerl's compiled one (`native_*`), chosen by `choice`."""
