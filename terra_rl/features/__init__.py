"""The policy's parameter-free inputs, computed from the observation dict: the compass, the
egocentric view, the dig- and pose-distance fields, and the map channels. Imports nothing
else from terra_rl."""
