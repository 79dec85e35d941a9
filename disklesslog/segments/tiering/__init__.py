"""Tiering of local logs (KIP-405): closed segments copied to object storage, local
copies deleted past ``local_retention_*``, reads falling through to the tier.

``target`` is where a log tiers and how its objects are reached, ``manifest`` a
stream's record of its tiered segments, ``reader`` reads across the tiered and the
local part, ``operations`` the tiering operations themselves."""
