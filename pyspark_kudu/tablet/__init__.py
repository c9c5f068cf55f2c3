"""See DESIGN §2."""
