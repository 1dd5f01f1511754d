"""How often a repeated complaint is logged."""


def worth_logging(count: int) -> bool:
    """Log the first rejections one by one, then every thousandth: a peer sending junk
    must not fill the disk through our log (each one is counted all the same)."""
    return count <= 20 or count % 1000 == 0
