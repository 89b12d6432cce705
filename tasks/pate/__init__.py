"""pate"""
