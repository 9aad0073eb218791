"""Retroactive paging (§X): a conversation's messages become turns, and its history becomes pages."""
