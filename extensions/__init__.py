"""Operator plug-ins on the up- and down-links: authentication sources (password file, JWT, HTTP) and the ACL."""
