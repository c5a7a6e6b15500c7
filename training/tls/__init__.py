"""TLS to the games: the client's files (`config`), a handshake check that turns a
wrong CA, an expired certificate or a plaintext game into one line naming the
endpoint (`handshake`), and throwaway certificates for `uerl local --tls` and
`uerl tls-secret` (`certificates`)."""
