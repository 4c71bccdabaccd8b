"""A process outside the job that tries the TLS handshake on a peer-channel port.

    tls_probe.py HOST PORT [CERT KEY]

Trusts any server certificate (so only the server's decision shows), presents CERT/KEY
if given, sends HTTP/2's preface and an empty SETTINGS frame, and prints one line:
ACCEPTED when the server answers (a gRPC server sends its SETTINGS), else REFUSED with
why: OpenSSL's reason for a failed handshake, or "closed" when the server hung up (in
TLS 1.3 a server checks the client's certificate after the client has finished its
side of the handshake, and may close without an alert).
"""
import socket
import ssl
import sys


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    if len(sys.argv) == 5:
        context.load_cert_chain(sys.argv[3], sys.argv[4])
    with socket.create_connection((host, port), timeout=20) as raw:
        try:
            with context.wrap_socket(raw) as tls:
                tls.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
                print("ACCEPTED" if tls.recv(64) else "REFUSED closed")
        except ssl.SSLError as e:
            print("REFUSED", e.reason)
        except ConnectionError as e:
            print("REFUSED closed:", e)


main()
