"""pcp-proxy: the HTTP host of the Paged-Context-Protocol engine."""
