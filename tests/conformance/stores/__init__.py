"""The store conformance kit: every installed message store runs every test here.

Stores are discovered from the plugin manager (`equeue_store_engines`), so a new store plugin gets
the whole suite by being installed. Each store also supplies its reader under the same name.
"""
