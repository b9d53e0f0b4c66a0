"""dashboards"""
