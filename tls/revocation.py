"""Certificate revocation as OpenSSL checks it with X509_V_FLAG_CRL_CHECK_ALL (the gateway's
`ssl.VERIFY_CRL_CHECK_CHAIN`), for peers that have no CRL option of their own (grpcio): every
certificate of a peer's chain, leaf to root, is looked up by issuer and serial number in its
issuer's CRL, and a chain with an issuer whose CRL is missing is refused too."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature

_CRL_BLOCK = re.compile(rb"-----BEGIN X509 CRL-----.+?-----END X509 CRL-----", re.DOTALL)


def pem_crl_blocks(pem: bytes) -> list[bytes]:
    """The CRLs of a PEM file, one block each (a chain's CAs may each have one)."""
    return _CRL_BLOCK.findall(pem)


@dataclass(frozen=True, eq=False)
class Revocations:
    """What the CRLs of `authorities` revoke: `revoked` holds (issuer, serial number) pairs,
    `issuers` the CAs that have a CRL."""

    authorities: tuple[x509.Certificate, ...]
    issuers: frozenset[x509.Name]
    revoked: frozenset[tuple[x509.Name, int]]

    def __len__(self) -> int:
        return len(self.revoked)

    @functools.lru_cache(maxsize=256)  # keyed by the chain's PEM: one check per client, not per call
    def refusal(self, chain_pem: bytes) -> str | None:
        """Why a peer presenting `chain_pem` (its certificate, then any intermediates) is
        refused, or None."""
        for certificate in self.chain(x509.load_pem_x509_certificates(chain_pem)):
            if certificate.issuer == certificate.subject:
                return None  # the trust anchor: no CRL speaks for it
            if certificate.issuer not in self.issuers:
                return f"no CRL of {certificate.issuer.rfc4514_string()} is loaded"
            if (certificate.issuer, certificate.serial_number) in self.revoked:
                return f"the certificate of {certificate.subject.rfc4514_string()} has been revoked"
        return None

    def chain(self, presented: Sequence[x509.Certificate]) -> list[x509.Certificate]:
        """The leaf, then each issuer found by name and signature among the certificates
        presented and the trusted CAs, up to a self-signed one or the last one found."""
        leaf, *intermediates = presented
        candidates = [*intermediates, *self.authorities]
        chain = [leaf]
        while chain[-1].issuer != chain[-1].subject:
            issuer = next((candidate for candidate in candidates if candidate not in chain
                           and _is_issued_by(chain[-1], candidate)), None)
            if issuer is None:
                break
            chain.append(issuer)
        return chain


def revocations(crls: Sequence[x509.CertificateRevocationList],
                authorities: Sequence[x509.Certificate]) -> Revocations:
    return Revocations(authorities=tuple(authorities),
                       issuers=frozenset(crl.issuer for crl in crls),
                       revoked=frozenset((crl.issuer, entry.serial_number)
                                         for crl in crls for entry in crl))


def _is_issued_by(certificate: x509.Certificate, issuer: x509.Certificate) -> bool:
    if certificate.issuer != issuer.subject:
        return False
    try:
        certificate.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True
